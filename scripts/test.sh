#!/usr/bin/env bash
# `make test` after set-up, lint and type check: the whole pytest suite, then the Slurm 25.11 tier.
#
# The tier needs Slurm 25.11 and pyslurm compiled from source, which takes most of an hour of CPU on a
# 2-core machine. The suite spends much of its time waiting (for Airflow, Slurm and the trainers), so the
# build runs beside it at the lowest CPU priority and only fills those gaps; the tier's tests start once
# both are done. Both parts always run; the exit status fails if either failed.
#
#   PYTEST_ARGS  extra arguments for both pytest runs
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
mkdir -p .state
build_log=.state/slurm-25.11-build.log

set -m # the build gets its own process group, so a Ctrl-C or failure here can stop all of it
nice -n 19 scripts/build-slurm-25.11.sh >"$build_log" 2>&1 &
build_pid=$!
set +m
stop_build() {
  if kill -0 "$build_pid" 2>/dev/null; then
    kill -TERM -- "-$build_pid" 2>/dev/null || true
  fi
}
trap stop_build EXIT
trap 'stop_build; exit 130' INT TERM
echo "test: Slurm 25.11 tier build started beside the suite (pid $build_pid, log $build_log)"

suite_start=$(date +%s)
# shellcheck disable=SC2086
.venv/bin/python -m pytest ${PYTEST_ARGS:-}
suite_rc=$?
echo "test: pytest suite exit $suite_rc after $(($(date +%s) - suite_start)) s"

wait_start=$(date +%s)
wait "$build_pid"
build_rc=$?
echo "test: the 25.11 build finished $(($(date +%s) - wait_start)) s after the suite (exit $build_rc):"
sed 's/^/  /' "$build_log"

tier_rc=0
if [ "$build_rc" = 0 ] || [ "$build_rc" = 3 ]; then
  # Built (the tier finds it and does not build again) or no source (the tier says why it skips).
  scripts/test-slurm-25.11.sh
  tier_rc=$?
else
  echo "test: the Slurm 25.11 build failed; the tier cannot run" >&2
  tier_rc=$build_rc
fi

if [ "$suite_rc" != 0 ] || [ "$tier_rc" != 0 ]; then
  echo "test: FAILED (suite exit $suite_rc, Slurm 25.11 tier exit $tier_rc)" >&2
  exit 1
fi
echo "test: passed (suite and Slurm 25.11 tier)"
