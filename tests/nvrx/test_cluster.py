"""NVRx in the job, on the real four-node cluster through the Slurm layer (3 nodes x 1 CPU rank, tiny).

Real parts only: Slurm (several slurmd on 127.0.0.1), srun, NVRx 0.4.1's ft_launcher and rank monitors,
torch.distributed with gloo, the reference trainer and its injected faults.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path

import pytest
from longrun.runspec import Drill, RunSpec
from longrun.slurm.models import JobStatus
from longrun.slurm.outcomes import Kind

from training.records.schema import EXIT_SDC_VERDICT

_spec = importlib.util.spec_from_file_location(
    "bench_nvrx", Path(__file__).resolve().parents[2] / "bench" / "bench_nvrx.py"
)
assert _spec and _spec.loader
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
bench_timeline, bench_overhead_line = _bench.timeline, _bench.overhead_line

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

#: Long enough (~15-30 s of steps) for the first checkpoint to be complete before a late fault: the
#: first save starts NVRx's async upload worker, which takes ~10 s on this loaded 2-core machine.
STEPS = 100


def tiny(name: str, **kw) -> RunSpec:
    base = dict(
        run_name=name,
        nodes=3,
        gpus_per_node=0,
        model="tiny",
        steps=STEPS,
        checkpoint_every=10,
        recompute_every=5,
        vote_every=5,
        max_restarts=2,
        time_limit_min=10,
    )
    return RunSpec(**{**base, **kw})


@pytest.fixture(scope="module")
def clean(launcher):
    """An uninterrupted run: the reference for the final weights."""
    run = launcher.launch(tiny("clean"))
    assert run.outcome.label == "completed", run.log
    return run


def test_clean_run_completes_without_restarts(clean):
    assert clean.state.exit_code == 0 and clean.outcome.kind is Kind.SUCCESS
    assert clean.report()["final_step"] == STEPS
    progress = clean.progress()
    assert progress["restart_count"] == 0 and progress["nvrx"]["active"] is True
    # Timeouts were calculated only once a save (step 10) and an audit (step 5) had both been seen.
    assert progress["nvrx"]["timeouts_calculated_at"] == 10
    assert clean.count(r"in-job restart \d+:") == 0


def test_sigkill_is_recovered_in_job_with_the_same_weights(launcher, clean):
    run = launcher.launch(tiny("crash", drill=Drill(kind="crash", step=95, target="1")))
    assert run.outcome.label == "completed", run.log
    assert run.state.restart_count == 0  # Slurm never restarted the job: ft_launcher did, inside it
    assert run.count(r"FAULT crash: rank 1 SIGKILLs itself at step 95") == 1
    assert run.count(r"in-job restart 1: resuming from .*checkpoints/step-000000[1-9]0") == 1
    assert run.progress()["restart_count"] == 1
    assert run.report()["final_fingerprint"] == clean.report()["final_fingerprint"]
    # The benchmark's parser reads the same timeline from the Slurm job's log.
    t = bench_timeline(run.log)
    assert t["resumed_step"] in (10, 20, 30, 40, 50, 60, 70, 80, 90) and t["total"] > 0
    print(f"job {run.job_id}: {bench_overhead_line(t)}")


#: The floor under the calculated heartbeat timeout in the hang test: the hang is caught this long after
#: rank 2's last heartbeat. The module's floor (60 s, `NvrxLaunch.for_step_time`) guards every other run
#: here against a step stalled for tens of seconds on a loaded host; this run is made to hang, and half
#: that floor still leaves a healthy step 30 s (it takes under 1 s) before a false timeout would add a
#: second restart, which the test would see.
HANG_TIMEOUT_S = 30.0


def test_hang_is_detected_by_heartbeat_timeout_and_recovered(launcher, clean):
    nvrx = dataclasses.replace(launcher.nvrx, min_timeout_s=HANG_TIMEOUT_S)
    run = launcher.launch(tiny("hang", drill=Drill(kind="hang", step=60, target="2")), nvrx=nvrx)
    assert run.outcome.label == "completed", run.log
    assert run.count(r"FAULT hang: rank 2 sleeps at step 60") == 1
    assert run.count(r"Did not get subsequent heartbeat") >= 1  # NVRx's rank monitor saw it
    assert run.progress()["restart_count"] == 1
    assert run.report()["final_fingerprint"] == clean.report()["final_fingerprint"]


def test_sdc_verdict_ends_the_job_with_93_without_restart(launcher):
    run = launcher.launch(tiny("sdc", drill=Drill(kind="nan", step=12, target="1")))
    assert run.state.status is JobStatus.FAILED and run.state.exit_code == EXIT_SDC_VERDICT, run.log
    assert run.outcome.label == "sdc_verdict" and run.outcome.kind is Kind.TERMINAL
    [alert] = run.alerts()
    assert (alert["check"], alert["step"], alert["suspect_ranks"]) == ("finite", 12, [1])
    # Every rank asked ft_launcher to stop; none was started a second time.
    assert (
        run.count(
            r"Received request from rank=\d+: req=WorkloadControlRequest\(action=WorkloadAction.ShutdownWorkload"
        )
        >= 1
    )
    assert run.count(r"in-job restart \d+:") == 0
    assert run.count(r"rank \d/3 on n\d") == 3
    assert "SDC verdict in this launch" in run.log


def test_a_job_that_keeps_crashing_stops_after_its_restart_budget(launcher):
    run = launcher.launch(
        tiny(
            "crashloop",
            drill=Drill(kind="crash", step=3, target="0"),
            max_restarts=1,
            extra_env={"LONGRUN_FAULTS_EVERY_RESTART": "1"},
        )
    )
    assert run.state.status is JobStatus.FAILED and run.state.exit_code == 1, run.log
    assert run.outcome.kind is Kind.TERMINAL and run.outcome.label == "failed"
    assert run.count(r"FAULT crash: rank 0 SIGKILLs itself at step 3") == 2  # first run + 1 restart
    assert run.count(r"in-job restart 1") >= 1 and run.count(r"in-job restart 2") == 0
    assert "in-job restarts in this launch: 1" in run.log and "ft_launcher exit 1" in run.log
    assert not run.alerts()


@pytest.mark.skipif(
    os.environ.get("LONGRUN_BENCH_TESTS") != "1",
    reason="a bench run as a test: `make test-bench` (LONGRUN_BENCH_TESTS=1)",
)
def test_bench_slurm_mode_measures_a_recovery(slurm_cluster, monkeypatch, tmp_path, capsys):
    """bench/bench_nvrx.py --mode slurm: the launch path itself, SIGKILL late, one breakdown line. A bench
    run as a test (about 100 s of a loaded 2-core machine): `make test-bench`, not `make test`; the same
    recoveries are proven by the tests above."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    base = str(slurm_cluster.stack.layout.port_base - 12000)  # the session's own range (conftest)
    assert _bench.main(["--mode", "slurm", "--steps", "60", "--crash-step", "55", "--port-base", base]) == 0
    out = capsys.readouterr().out
    assert "command: python bench/bench_nvrx.py --mode slurm" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("[1/1] recovery overhead"))
    assert "steps replayed: 5" in line
