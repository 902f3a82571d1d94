#!/usr/bin/env bash
# The GPU path on one device, in one call (see docs/gpu.md): fingerprint throughput and GPU == CPU, the CUDA
# snapshot stall, the checks' cost per step of a ~1B-parameter model, NVRx 0.7 under ft_launcher.
#
#   bench/gpu/run.sh                 on the GPU machine; NVRx 0.7 wheels from .whl/ (bench/gpu/prepare_wheels.sh)
#   bench/gpu/run.sh --dry-run       CPU, small sizes, NVRx launches skipped (what CI runs)
#
# Writes device_check.json (and the NVRx logs) under $OUT, else ./bench-gpu-out. Stops itself after
# GPU_CHECK_LIMIT_S seconds (default 470: inside an 8-minute budget).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
dry=0
for a in "$@"; do [[ $a == --dry-run ]] && dry=1; done
if [[ $dry == 0 ]] && compgen -G ".whl/*.whl" >/dev/null; then
  site=${GPU_CHECK_SITE:-/tmp/longrun-gpu-site}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$site/bin:$PATH"
fi
export PYTHONUNBUFFERED=1
if [[ $dry == 0 ]]; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true; fi
exec timeout --signal=TERM --kill-after=20 "${GPU_CHECK_LIMIT_S:-470}" \
  "$PY" bench/gpu/device_check.py --out "${OUT:-bench-gpu-out}" "$@"
