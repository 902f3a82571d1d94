#!/usr/bin/env bash
# Builds Slurm 25.11.7 from its source tarball and pyslurm 25.11.2 from its PyPI sdist into a cache under
# .state/, once. pyslurm exists on PyPI only for Slurm 25.11 and no Debian release ships 25.11, so this is
# the only way to exercise the pyslurm backend against a real cluster.
#
#   LONGRUN_SLURM_SOURCE  path of slurm-25.11.7.tar.gz (default: the first one found in ../shared/vendor/,
#                         ../vendor/ or vendor/ relative to the repository root)
#   LONGRUN_SLURM_PREFIX  install prefix (default: .state/slurm-25.11); pyslurm goes to PREFIX/site
#
# Exit 0 when built (or already built), 3 when the tarball is absent (the caller skips the tier and says
# why), anything else on a build failure. Safe to rerun: a stamp file records what was built.
set -euo pipefail
SLURM_VERSION=25.11.7
PYSLURM_VERSION=25.11.2
root="$(cd "$(dirname "$0")/.." && pwd)"
prefix="${LONGRUN_SLURM_PREFIX:-$root/.state/slurm-25.11}"
py="$root/.venv/bin/python"
stamp="$prefix/.built"
want="slurm=$SLURM_VERSION+json+multiple-slurmd pyslurm=$PYSLURM_VERSION python=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# Compiler flags for both builds: no optimiser, no debug info. The binaries only run a four-node test
# cluster on one machine, where their speed does not matter and the build time (on every CI run) does.
BUILD_CFLAGS="${LONGRUN_SLURM_CFLAGS:--O0 -g0}"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "build-slurm-25.11: already built ($want) in $prefix"
  exit 0
fi

src="${LONGRUN_SLURM_SOURCE:-}"
if [ -z "$src" ]; then
  for d in "$root/../shared/vendor" "$root/../vendor" "$root/vendor"; do
    if [ -f "$d/slurm-$SLURM_VERSION.tar.gz" ]; then src="$d/slurm-$SLURM_VERSION.tar.gz"; break; fi
  done
fi
if [ -z "$src" ] || [ ! -f "$src" ]; then
  echo "build-slurm-25.11: SKIP: slurm-$SLURM_VERSION.tar.gz not found (set LONGRUN_SLURM_SOURCE to its path)" >&2
  exit 3
fi

# libslurm's auth/munge plugin needs munge's headers, and the JSON output of squeue/sinfo (which the CLI
# backend reads) needs json-c's; only this tier needs them.
if [ ! -f /usr/include/munge.h ] || [ ! -f /usr/include/json-c/json.h ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "build-slurm-25.11: needs libmunge-dev and libjson-c-dev (run as root or apt-get install them)" >&2
    exit 1
  fi
  echo "build-slurm-25.11: installing libmunge-dev, libjson-c-dev, gcc, make (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends libmunge-dev libjson-c-dev gcc make python3-dev >/dev/null
fi

work="$prefix/build"
slurm_stamp="$prefix/.slurm-built"
if [ "$(cat "$slurm_stamp" 2>/dev/null)" != "slurm=$SLURM_VERSION+json+multiple-slurmd" ]; then
  rm -rf "$work"
  mkdir -p "$work"
  start=$(date +%s)
  echo "build-slurm-25.11: Slurm $SLURM_VERSION from $src into $prefix (make -j3; a few minutes)"
  tar -xzf "$src" -C "$work"
  (
    cd "$work/slurm-$SLURM_VERSION"
    # No static archives: with them libtool compiles every source file twice (PIC and not).
    CFLAGS="$BUILD_CFLAGS" ./configure -q --prefix="$prefix" --sysconfdir="$prefix/etc" --disable-debug \
      --disable-static --enable-multiple-slurmd >"$work/configure.log" 2>&1 \
      || { tail -30 "$work/configure.log" >&2; exit 1; }
    make -s -j3 >"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
    make -s install >"$work/install.log" 2>&1 || { tail -30 "$work/install.log" >&2; exit 1; }
  )
  rm -rf "$work/slurm-$SLURM_VERSION"
  test -f "$prefix/lib/slurm/serializer_json.so" || { echo "build-slurm-25.11: no JSON serializer built" >&2; exit 1; }
  echo "slurm=$SLURM_VERSION+json+multiple-slurmd" >"$slurm_stamp"
  echo "build-slurm-25.11: Slurm built in $(($(date +%s) - start)) s"
fi

# pyslurm from its sdist, compiled against the headers and library just installed. Its build needs
# Cython; pip's isolated build environment fetches it (as a wheel: --no-binary names pyslurm only).
start=$(date +%s)
rm -rf "$prefix/site" "$work/sdist"
"$py" -m pip download -q --no-deps --no-binary pyslurm -d "$work/sdist" "pyslurm==$PYSLURM_VERSION"
CFLAGS="$BUILD_CFLAGS" SLURM_INCLUDE_DIR="$prefix/include" SLURM_LIB_DIR="$prefix/lib" \
  "$py" -m pip install -q --no-deps --target "$prefix/site" "$work/sdist"/pyslurm-*.tar.gz \
  >"$work/pyslurm.log" 2>&1 || { tail -40 "$work/pyslurm.log" >&2; exit 1; }
echo "build-slurm-25.11: pyslurm built in $(($(date +%s) - start)) s"
echo "$want" >"$stamp"
echo "build-slurm-25.11: done ($want)"
