"""bench/bench_nvrx.py's log parser on a synthetic timeline (the benchmark itself runs ranks: `make bench`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_nvrx.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_nvrx", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOG = """\
2026-11-29 16:13:05,000 r1 training.faults WARNING FAULT crash: rank 1 SIGKILLs itself at step 95
[2026-11-29 16:13:05,500] [ERROR] [ft_launcher1@vm] failed (exitcode: -9) local_rank: 0 (pid: 8469) of binary: python3
[2026-11-29 16:13:06,000] [INFO] [ft_launcher1@vm] The node 'a' attempts to join the next round of the rendezvous '2'.
[2026-11-29 16:13:07,000] [INFO] [ft_launcher2@vm] The node 'b' attempts to join the next round of the rendezvous '2'.
[2026-11-29 16:13:08,500] [INFO] [ft_launcher2@vm] The node 'b' has joined round 1 of the rendezvous '2' as rank 1 in a world of size 3.
2026-11-29 16:13:20,500 r0 training.nvrx INFO NVRx 0.4.1 heartbeats on (restart 1, initial timeouts x)
2026-11-29 16:13:21,000 r0 training.loop INFO resumed from /r/checkpoints/step-00000090 at step 90
2026-11-29 16:13:21,250 r2 training.nvrx INFO NVRx first heartbeat of restart 1 at step 91
"""


def test_timeline_breaks_the_recovery_down(bench):
    t = bench.timeline(LOG)
    assert (t["detection"], t["shutdown"], t["rendezvous"]) == (0.5, 1.5, 1.5)
    assert (t["start"], t["ckpt_load"], t["first_step"], t["total"]) == (12.0, 0.5, 0.25, 16.25)
    assert bench.overhead_line(t).endswith("steps replayed: 5")


def test_a_restart_from_scratch_has_no_load_phase(bench):
    t = bench.timeline("\n".join(ln for ln in LOG.splitlines() if "resumed from" not in ln))
    assert t["ckpt_load"] == 0.0 and t["first_step"] == 0.75 and t["resumed_step"] == -1


def test_no_crash_no_timeline(bench):
    with pytest.raises(ValueError, match="no crash"):
        bench.timeline("nothing happened")
