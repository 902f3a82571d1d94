#!/usr/bin/env bash
# `make test` after set-up and lint: the whole pytest suite and, beside it, the type check and the Slurm
# 25.11 tier.
#
# The type check (mypy with a cold cache, as in a fresh clone: about 100 s of CPU, over 3 minutes on two
# busy cores) used to run before the suite. It now runs beside the suite's first minutes, which mostly wait
# for the stack to start, at a lower priority than the suite (nice 10) but above the build (nice 19). Its
# output is printed once the suite is done, and the exit status fails if it failed.
#
# The suite runs in three parts side by side (tests/helpers/suite_parts.py), each a pytest session with a
# stack of its own: the tests that need Airflow (the drills; they wait on Airflow, Slurm and the trainers
# for much of their time) in the foreground; in the background, the tests that drive the cluster without
# Airflow (tests/slurm, mostly waiting on Slurm, and tests/nvrx's jobs), and everything else (units and the
# job side, which keep one core busy). One session alone left a core idle for much of the suite. The background parts' output
# goes to logs printed at the end. When PYTEST_ARGS names test paths (a word starting with "tests"), the
# suite runs as one part, as given.
#
# The tier needs Slurm 25.11 and pyslurm compiled from source, which takes most of an hour of CPU on a
# 2-core machine. The suite spends much of its time waiting (for Airflow, Slurm and the trainers), so the
# build runs beside it at the lowest CPU priority and only fills those gaps. The tier's tests start as soon
# as the build is done, still beside the suite: they too mostly wait (on Slurm's time limits and node
# states), on a cluster of their own (its own state dir and port range). Their output goes to a log that is
# printed once both are done. Both parts always run; the exit status fails if either failed.
#
#   PYTEST_ARGS  extra arguments for both pytest runs
#   MYPY_TARGETS what mypy checks (the Makefile's; default: training plugins/longrun)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
total_start=$(date +%s)
mkdir -p .state
build_log=.state/slurm-25.11-build.log
tier_log=.state/slurm-25.11-tier.log
typecheck_log=.state/typecheck.log
slurm_part_log=.state/suite-slurm-part.log
other_part_log=.state/suite-other-part.log
# One line per tier, "name|seconds|result", written by whoever ran it (the background jobs included).
times_file=.state/test-tiers.txt
: >"$times_file"
record() { echo "$1|$2|$3" >>"$times_file"; }

# Set-up (Debian packages, the venv) and lint first: nothing else can run without them.
for target in setup lint; do
  start=$(date +%s)
  if ! make --no-print-directory "$target"; then
    echo "test: FAILED: make $target" >&2
    exit 1
  fi
  record "$target" $(($(date +%s) - start)) ok
done

# The build (at nice 19), then the tier (at normal priority), in one background job. Its exit status: the
# build's when it failed (3, no source, is not a failure: the tier then skips with its reason), else the tier's.
build_then_tier() {
  local start rc
  start=$(date +%s)
  nice -n 19 scripts/build-slurm-25.11.sh >"$build_log" 2>&1
  rc=$?
  echo "test: the 25.11 build ended after $(($(date +%s) - start)) s (exit $rc)" >"$tier_log"
  if [ "$rc" = 3 ]; then
    record "Slurm 25.11 build" $(($(date +%s) - start)) "NOT RUN: no Slurm 25.11 source (docs/slurm.md)"
    record "Slurm 25.11 tier" 0 "NOT RUN: no Slurm 25.11 source"
    if [ "${CI:-}" = true ]; then
      echo "test: CI runs every tier, and the Slurm 25.11 source is missing" >>"$tier_log"
      return 3
    fi
    return 0
  elif [ "$rc" != 0 ]; then
    record "Slurm 25.11 build" $(($(date +%s) - start)) "FAILED (exit $rc)"
    echo "test: the Slurm 25.11 build failed; the tier cannot run" >>"$tier_log"
    return "$rc"
  fi
  record "Slurm 25.11 build" $(($(date +%s) - start)) ok
  start=$(date +%s)
  scripts/test-slurm-25.11.sh >>"$tier_log" 2>&1 </dev/null
  rc=$?
  record "Slurm 25.11 tier" $(($(date +%s) - start)) "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
  return "$rc"
}

# The type check, in a background job of its own; it writes its exit status and duration to the log's end.
typecheck() {
  local start rc
  start=$(date +%s)
  # shellcheck disable=SC2086
  nice -n 10 .venv/bin/mypy ${MYPY_TARGETS:-training plugins/longrun} >"$typecheck_log" 2>&1 </dev/null
  rc=$?
  echo "test: type check (mypy) exit $rc after $(($(date +%s) - start)) s" >>"$typecheck_log"
  record "type check (mypy)" $(($(date +%s) - start)) "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
  return "$rc"
}

# A background part of the suite (see the top): its exit status, and its duration in the table.
#   $1: the part (LONGRUN_SUITE_PART), $2: its name in the table, $3: its log
background_part() {
  local start rc
  start=$(date +%s)
  # shellcheck disable=SC2086
  LONGRUN_SUITE_PART=$1 .venv/bin/python -m pytest -p no:cacheprovider ${PYTEST_ARGS:-} >"$3" 2>&1 </dev/null
  rc=$?
  echo "test: the suite's part $1 exit $rc after $(($(date +%s) - start)) s" >>"$3"
  record "$2" $(($(date +%s) - start)) "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
  return "$rc"
}
split=1
case " ${PYTEST_ARGS:-} " in
*" tests"*) split=0 ;;
esac

set -m # the background jobs get their own process groups, so a Ctrl-C or failure here can stop all of it
build_then_tier &
tier_pid=$!
typecheck &
typecheck_pid=$!
part_pids=""
if [ "$split" = 1 ]; then
  background_part slurm "suite: slurm, nvrx" "$slurm_part_log" &
  slurm_part_pid=$!
  background_part other "suite: other" "$other_part_log" &
  other_part_pid=$!
  part_pids="$slurm_part_pid $other_part_pid"
fi
set +m
stop_background() {
  local pid
  for pid in "$tier_pid" "$typecheck_pid" $part_pids; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || true
    fi
  done
}
trap stop_background EXIT
trap 'stop_background; exit 130' INT TERM
echo "test: the type check started beside the suite (pid $typecheck_pid; log $typecheck_log)"
echo "test: the Slurm 25.11 build, then its tier, started beside the suite (pid $tier_pid; logs $build_log, $tier_log)"

if [ "$split" = 1 ]; then
  echo "test: the suite's Slurm part (tests/slurm and tests/nvrx without Airflow) started beside (pid $slurm_part_pid; log $slurm_part_log)"
  echo "test: the suite's other part (no Airflow) started beside (pid $other_part_pid; log $other_part_log)"
  suite_part=airflow
  suite_name="suite: airflow"
else
  suite_part=""
  suite_name="suite (pytest)"
fi
suite_start=$(date +%s)
# shellcheck disable=SC2086
LONGRUN_SUITE_PART=$suite_part .venv/bin/python -m pytest ${PYTEST_ARGS:-}
suite_rc=$?
echo "test: pytest suite exit $suite_rc after $(($(date +%s) - suite_start)) s"
record "$suite_name" $(($(date +%s) - suite_start)) "$([ "$suite_rc" = 0 ] && echo ok || echo "FAILED (exit $suite_rc)")"
if [ "$split" = 1 ]; then
  for part in slurm other; do
    if [ "$part" = slurm ]; then pid=$slurm_part_pid log=$slurm_part_log; else pid=$other_part_pid log=$other_part_log; fi
    wait "$pid"
    part_rc=$?
    echo "test: the suite's $part part's log:"
    cat "$log"
    if [ "$part_rc" != 0 ] && [ "$suite_rc" = 0 ]; then
      suite_rc=$part_rc
    fi
  done
fi

wait "$typecheck_pid"
typecheck_rc=$?
echo "test: the type check's output:"
sed 's/^/  /' "$typecheck_log"

wait_start=$(date +%s)
wait "$tier_pid"
tier_rc=$?
echo "test: the 25.11 build and tier finished $(($(date +%s) - wait_start)) s after the suite (exit $tier_rc)"
echo "test: the 25.11 build's log:"
sed 's/^/  /' "$build_log"
echo "test: the 25.11 tier's log:"
cat "$tier_log"

echo "test: durations (the type check and the 25.11 build and tier ran beside the suite)"
while IFS='|' read -r name seconds result; do
  printf 'test:   %-20s %6s s  %s\n' "$name" "$seconds" "$result"
done <"$times_file"
printf 'test:   %-20s %6s s\n' "total" $(($(date +%s) - total_start))

if [ "$suite_rc" != 0 ] || [ "$typecheck_rc" != 0 ] || [ "$tier_rc" != 0 ]; then
  echo "test: FAILED (suite exit $suite_rc, type check exit $typecheck_rc, Slurm 25.11 build and tier exit $tier_rc)" >&2
  exit 1
fi
not_run=$(grep -F '|NOT RUN' "$times_file" | cut -d'|' -f1 | paste -sd, - | sed 's/,/, /g')
if [ -n "$not_run" ]; then
  echo "test: passed, but NOT every tier ran: not run: $not_run (see the table above)"
else
  echo "test: passed (set-up, lint, suite, type check, Slurm 25.11 build and tier)"
fi
