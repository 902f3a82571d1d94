#!/usr/bin/env bash
# Download NVRx 0.7 as wheels for the device machine (Python 3.12, x86-64, glibc >= 2.39), which has torch
# and CUDA but no package registry. Run here, once, before a device run; the wheels land in .whl/
# (git-ignored) and travel with the run as a carried folder (docs/gpu.md says how).
#
#   bench/gpu/prepare_wheels.sh                      # nvidia-resiliency-ext 0.7.*
#   EXTRA_WHEELS="pkg==1.2 ..." bench/gpu/prepare_wheels.sh   # other extras instead of the default ones
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
NVRX=${NVRX_VERSION:-0.7.*}
# What the 0.7 launcher and fault-tolerance imports need beyond the device image: defusedxml is not there;
# its generated gRPC/protobuf modules check for grpcio >= 1.76 and protobuf 6.x (>= 6.31.1) at import.
DEFAULT_EXTRA="defusedxml grpcio>=1.76 protobuf>=6.31.1,<7"
dest=.whl
mkdir -p "$dest"
plat=()
for n in 39 35 34 31 28 27 24 17; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# shellcheck disable=SC2086  # EXTRA_WHEELS is a space-separated list on purpose
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d "$dest" "nvidia-resiliency-ext==$NVRX" ${EXTRA_WHEELS:-$DEFAULT_EXTRA}
echo "wheels in $dest:"
ls -l "$dest"
for w in "$dest"/nvidia_resiliency_ext-*.whl; do
  echo "requirements of $(basename "$w") (the device image must have these, else add them to EXTRA_WHEELS):"
  unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' || true
done
