# The two commands a user needs: `make demo` (the main job) and `make test` (the tests).
# Both do all of their own set-up on a fresh Debian 12 machine and are safe to rerun.
SHELL := /bin/bash
PY := .venv/bin/python
VENV_STAMP := .venv/.longrun-installed
# The public API is type-checked; the rest is linted.
MYPY_TARGETS := training plugins/longrun
PYTEST_ARGS ?=

.PHONY: setup system venv lint typecheck test test-fast test-chaos test-bench test-drills demo bench gpu-check gpu-check-dry stack-up stack-down stack-status clean

setup: system venv

system:
	@scripts/setup-system.sh

# .venv is built from the interpreter scripts/venv-python.sh chooses (Debian's python3, which the local
# stack's job user can run, when it is 3.11 or 3.12), and the stamp records it. A .venv built from another
# interpreter, or left half-built (no stamp), is removed and built again; otherwise it is reinstalled only
# when the dependency set changes.
venv:
	@base="$$(scripts/venv-python.sh)" && \
	if [ -e .venv ] && [ "$$(cat $(VENV_STAMP) 2>/dev/null)" != "$$base" ]; then \
	  echo "venv: .venv was not built from $$base (scripts/venv-python.sh); building it again"; \
	  rm -rf .venv; \
	fi
	@$(MAKE) --no-print-directory $(VENV_STAMP)

$(VENV_STAMP): pyproject.toml requirements.lock
	@base="$$(scripts/venv-python.sh)" && { test -x $(PY) || "$$base" -m venv .venv; }
	@echo "venv: installing the pinned set (requirements.lock) into .venv"
	@.venv/bin/pip install -q --upgrade pip
	@.venv/bin/pip install -q -c requirements.lock -e '.[airflow,dev,postgres,hf]'
	@.venv/bin/pip check
	@scripts/venv-python.sh >$@

lint: venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

typecheck: venv
	.venv/bin/mypy $(MYPY_TARGETS)

# The suite and, beside it, the type check and the Slurm 25.11 tier (its build at low priority, then its
# tests): scripts/test.sh, which runs set-up and lint first and times every tier.
test:
	@PYTEST_ARGS="$(PYTEST_ARGS)" MYPY_TARGETS="$(MYPY_TARGETS)" scripts/test.sh

# tests/slurm again on Slurm 25.11 built from source, with both backends (CLI and pyslurm). Without the
# source tarball: NOT RUN with its reason, and a failure under CI (docs/slurm.md).
test-slurm-25.11: setup
	@scripts/test-slurm-25.11.sh

# The fault matrix (tests/chaos): a drill per cell with one component killed mid-incident, and the
# monitor's retry budget over many resumes; long, so not part of `make test`. LONGRUN_TEST_DB=postgres
# runs it on PostgreSQL. Each cell writes its artefact (docs/reliability/cells/); the table in
# docs/reliability.md is then regenerated from them, whatever the session's result (docs/reliability.md).
test-chaos: setup
	LONGRUN_CHAOS=1 $(PY) -m pytest tests/chaos tests/monitor/test_monitor_retry_budget.py -m chaos -p no:cacheprovider $(PYTEST_ARGS); \
	rc=$$?; $(PY) scripts/reliability_table.py; exit $$rc

# The benches run as tests, not part of `make test`: the recovery bench (both paths, idle and busy; about
# 11 minutes) and bench_nvrx's Slurm mode (about 2 minutes).
test-bench: setup
	LONGRUN_BENCH_TESTS=1 $(PY) -m pytest tests/e2e/test_bench_recovery.py tests/nvrx/test_cluster.py::test_bench_slurm_mode_measures_a_recovery -p no:cacheprovider $(PYTEST_ARGS)

# The drills that `make test` leaves out, with those it runs: every sharded drill through Airflow (HSDP
# weight-flip and scale, FSDP2 sick-node), every drill of the transformers example through Airflow, and
# the in-job hot-spare recovery directed by the test (tests/nvrx/test_hot_spare.py).
test-drills: setup
	LONGRUN_ALL_DRILLS=1 $(PY) -m pytest tests/e2e/test_sharded_drill.py tests/e2e/test_entrypoints.py tests/nvrx/test_hot_spare.py -p no:cacheprovider $(PYTEST_ARGS)

# The fast suite: everything not marked slow.
test-fast: setup
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: setup
	$(PY) -m longrun.demo

bench: setup
	$(PY) bench/run_all.py

# On a GPU machine (its own python3 with torch + CUDA; no set-up, no registry): docs/gpu.md.
gpu-check:
	bench/gpu/run.sh

gpu-check-dry: setup
	PYTHON=$(PY) bench/gpu/run.sh --dry-run

stack-up: setup
	.venv/bin/longrun stack up

stack-down:
	.venv/bin/longrun stack down

stack-status:
	.venv/bin/longrun stack status

clean: stack-down
	rm -rf .state
