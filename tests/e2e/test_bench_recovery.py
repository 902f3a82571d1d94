"""bench/bench_recovery.py on the test session's stack: one drill per path (hot spare, requeue) and per
cluster state (idle, a competing job queued for the freed nodes). It prints the figures; it asserts only
what must hold whatever the load: each recovery resumed from the pick, and each took the path it should.
No timing threshold (a 2-core machine shared with other sessions).

It takes about 11 minutes (four drills), so it runs with `make test-bench` (LONGRUN_BENCH_TESTS=1), not in
`make test`: the drills it repeats (tests/e2e/test_drill.py, hot spare and requeue) stay there."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from helpers.marks import END_TO_END
from longrun.drill import Rest, prepare
from longrun.slurm.factory import make_client

from training.store.factory import store_from_env

pytestmark = [
    *END_TO_END,
    pytest.mark.skipif(
        os.environ.get("LONGRUN_BENCH_TESTS") != "1",
        reason="a bench run as a test: `make test-bench` (LONGRUN_BENCH_TESTS=1)",
    ),
]

_spec = importlib.util.spec_from_file_location(
    "bench_recovery", Path(__file__).resolve().parents[2] / "bench" / "bench_recovery.py"
)
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_bench_recovery_both_paths(airflow_stack, tmp_path, monkeypatch):
    for k, v in airflow_stack.env.items():
        monkeypatch.setenv(k, v)
    rest = Rest.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
    prepare(rest)
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    states = tuple(os.environ.get("LONGRUN_BENCH_STATES", "idle,busy").split(","))
    out = bench.run_bench(rest, client, store_from_env(), drills=1, competitor_s=90, workdir=str(tmp_path),
                          states=states)  # fmt: skip
    assert set(out) == {(p, s) for p in ("hot spare", "requeue") for s in states}
