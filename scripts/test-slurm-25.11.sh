#!/usr/bin/env bash
# The Slurm 25.11 tier: builds Slurm 25.11.7 and pyslurm 25.11.2 once (scripts/build-slurm-25.11.sh), then
# runs the whole tests/slurm suite against a four-node cluster started from those binaries, with both
# backends (pyslurm may not be skipped here: LONGRUN_REQUIRE_PYSLURM=1 turns a skip into a failure).
# Without the Slurm source tarball it cannot run: under CI (CI=true) that fails (exit 3); elsewhere it says
# NOT RUN with the reason and exits 0. Extra pytest arguments: $PYTEST_ARGS.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
prefix="${LONGRUN_SLURM_PREFIX:-$root/.state/slurm-25.11}"
export LONGRUN_SLURM_PREFIX="$prefix"

rc=0
scripts/build-slurm-25.11.sh || rc=$?
if [ "$rc" = 3 ]; then
  if [ "${CI:-}" = true ]; then
    echo "test-slurm-25.11: FAILED: no Slurm 25.11 source, and CI runs every tier (docs/slurm.md)" >&2
    exit 3
  fi
  echo "test-slurm-25.11: NOT RUN (no Slurm 25.11 source; see docs/slurm.md)"
  exit 0
elif [ "$rc" != 0 ]; then
  exit "$rc"
fi

export PATH="$prefix/bin:$prefix/sbin:$PATH"
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$prefix/site${PYTHONPATH:+:$PYTHONPATH}"
export LONGRUN_REQUIRE_PYSLURM=1
# The session starts its own stack on these binaries; never reuse a stack of another Slurm version.
unset LONGRUN_TEST_REUSE_STACK SLURM_CONF
version="$(slurmctld -V)"
case "$version" in
  "slurm 25.11."*) ;;
  *) echo "test-slurm-25.11: slurmctld on PATH is '$version', expected 25.11" >&2; exit 1 ;;
esac
echo "test-slurm-25.11: $version, $(.venv/bin/python -c 'import importlib.metadata as m; print("pyslurm", m.version("pyslurm"))')"
start=$(date +%s)
# shellcheck disable=SC2086
.venv/bin/python -m pytest tests/slurm -p no:cacheprovider ${PYTEST_ARGS:-}
echo "test-slurm-25.11: tests/slurm on Slurm 25.11 took $(($(date +%s) - start)) s"
