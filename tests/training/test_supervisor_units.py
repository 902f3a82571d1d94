"""The supervisor's choices without Slurm: which nodes the first attempt uses, the bounded wait, and the
directive it follows. The step is a real bash script; the allocation is given (Slurm's part is tested in
tests/slurm/test_supervisor.py)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from helpers.outage_store import OutageStore

from training.records.schema import EXIT_SDC_VERDICT, store_key
from training.spares.directive import Directive
from training.spares.supervisor import Supervisor
from training.store.interface import put_json
from training.store.local import LocalDirStore


def _sup(tmp_path, held, *, step, include=(), wait_s=5.0) -> Supervisor:
    return Supervisor(run="su", job_id="5", width=3, spares=1, wait_s=wait_s, poll_s=0.05, step=step,
                      store=LocalDirStore(tmp_path / "store"), include=include, nodes_now=lambda: list(held))  # fmt: skip


def test_the_first_attempt_uses_the_drill_node(tmp_path):
    out = tmp_path / "nodes"
    held = ["n1", "n2", "n3", "n4"]
    assert _sup(tmp_path, held, step=f"echo $LONGRUN_STEP_NODES > {out}", include=("n4",))() == 0
    assert out.read_text().strip() == "n1,n2,n4"
    assert _sup(tmp_path, held, step=f"echo $LONGRUN_STEP_NODES > {out}")() == 0
    assert out.read_text().strip() == "n1,n2,n3"


def test_the_wait_is_bounded_and_a_directive_is_followed(tmp_path, capsys):
    log = tmp_path / "log"
    step = f'echo "$LONGRUN_ATTEMPT $LONGRUN_STEP_NODES $LONGRUN_RESUME_FROM" >> {log}; [ "$LONGRUN_ATTEMPT" != 0 ]'
    step += f" || exit {EXIT_SDC_VERDICT}"
    t0 = time.monotonic()
    assert _sup(tmp_path, ["n1", "n2", "n3", "n4"], step=step, wait_s=0.5)() == EXIT_SDC_VERDICT
    # It waited (a lower bound: sleeps only lengthen on a loaded machine), then gave up because the wait
    # ran out, not for another reason. An unbounded wait never returns: pytest-timeout fails it.
    assert time.monotonic() - t0 >= 0.5
    assert "no directive in time: exit 93" in capsys.readouterr().out
    d = Directive(run="su", job_id="5", attempt=1, nodes=("n4", "n1", "n3"), resume_from="runs/su/checkpoints/step-00000010/",
                  incident_id="i", exclude=("n2",), issued_at=time.time())  # fmt: skip
    put_json(LocalDirStore(tmp_path / "store"), store_key("su", d.relative_path), d.to_json())
    log.unlink()
    assert _sup(tmp_path, ["n1", "n3", "n4"], step=step)() == 0
    assert log.read_text().splitlines() == ["0 n1,n3,n4 ", "1 n1,n3,n4 runs/su/checkpoints/step-00000010/"]


# --- the warm standby: a fake step (no torch, no Slurm) that behaves like the trainer on its directive ---
FAKE_STEP = """
import os, sys, time
from training.records.schema import store_key
from training.spares.standby import await_directive
from training.store.interface import put_json
from training.store.local import LocalDirStore

store = LocalDirStore(os.environ["LONGRUN_STORE_DIR"])
attempt, nodes = int(os.environ["LONGRUN_ATTEMPT"]), os.environ["LONGRUN_STEP_NODES"]
log = open(sys.argv[1], "a")
resume = os.environ["LONGRUN_RESUME_FROM"]
if os.environ.get("LONGRUN_STANDBY_WAIT_S"):
    print(f"standby {attempt} {nodes} pid={os.getpid()}", file=log, flush=True)
    resume = await_directive(store, run="su", job_id="5", attempt=attempt, nodes=nodes.split(","),
                             wait_s=float(os.environ["LONGRUN_STANDBY_WAIT_S"]), rank=0, poll_s=0.05)
    if resume is None:
        sys.exit(2)
print(f"train {attempt} {nodes} {resume}", file=log, flush=True)
if attempt == 0:  # the first attempt's verdict: n2 is the suspect
    put_json(store, store_key("su", "alerts/00000020-recompute-x.json"), {"time": time.time(), "suspect_nodes": ["n2"]})
    # like a real step after its alert (last upload, teardown): still running, until the standby is up
    deadline = time.monotonic() + float(os.environ.get("FAKE_HOLD_S", "30"))
    while time.monotonic() < deadline and "standby" not in open(sys.argv[1]).read():
        time.sleep(0.05)
    print("end 0", file=log, flush=True)
    sys.exit(int(os.environ.get("FAKE_RC", "93")))
"""
CKPT = "runs/su/checkpoints/step-00000010/"


def _standby_case(tmp_path, monkeypatch, nodes, exclude, *, wait_s=60.0, standby_at="alert"):
    """Run a supervisor whose first attempt ends with n2's verdict; the directive (if `nodes`) is written
    once that step has ended. Returns (exit code, log lines, supervisor output)."""
    monkeypatch.setenv("LONGRUN_STORE_DIR", str(tmp_path / "store"))
    fake, log = tmp_path / "fake_step.py", tmp_path / "log"
    fake.write_text(FAKE_STEP)
    sup = _sup(tmp_path, ["n1", "n2", "n3", "n4"], step=f"exec {sys.executable} {fake} {log}", wait_s=wait_s)
    sup.stop_s, sup.standby_at = 5.0, standby_at

    def direct() -> None:
        deadline = time.monotonic() + 60
        # as sdc_incident does: only once the alerting step has ended (and the standby waits)
        while time.monotonic() < deadline and "end 0" not in (log.read_text() if log.exists() else ""):
            time.sleep(0.05)
        d = Directive(run="su", job_id="5", attempt=1, nodes=nodes, resume_from=CKPT, incident_id="i",
                      exclude=exclude, issued_at=time.time())  # fmt: skip
        put_json(LocalDirStore(tmp_path / "store"), store_key("su", d.relative_path), d.to_json())

    writer = threading.Thread(target=direct, daemon=True) if nodes else None
    if writer:
        writer.start()
    rc = sup()
    lines = log.read_text().splitlines()
    for line in lines:  # whatever it did, no step process is left behind
        if "pid=" in line:
            pid = int(line.split("pid=")[1])
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    return rc, [line.split(" pid=")[0] for line in lines]


def test_a_standby_directed_to_its_nodes_trains_without_a_second_start(tmp_path, monkeypatch, capsys):
    rc, lines = _standby_case(tmp_path, monkeypatch, ("n1", "n3", "n4"), ("n2",))
    assert rc == 0
    # the standby started at the alert, while the alerting step was still running
    assert lines == ["train 0 n1,n2,n3 ", "standby 1 n1,n3,n4", "end 0", f"train 1 n1,n3,n4 {CKPT}"]
    out = capsys.readouterr().out
    assert "attempt 0 raised an alert while its step ends" in out
    assert "the standby is directed: it trains" in out and "stopping the standby" not in out


def test_a_standby_directed_elsewhere_is_stopped_and_the_directed_step_runs(tmp_path, monkeypatch, capsys):
    # the orchestrator attributed n3, not the alert's n2: the standby on n1,n3,n4 must never train
    rc, lines = _standby_case(tmp_path, monkeypatch, ("n1", "n2", "n4"), ("n3",))
    assert rc == 0
    assert lines == ["train 0 n1,n2,n3 ", "standby 1 n1,n3,n4", "end 0", f"train 1 n1,n2,n4 {CKPT}"]
    assert "stopping the standby (directed to n1,n2,n4, not n1,n3,n4)" in capsys.readouterr().out


def test_a_standby_without_a_directive_is_stopped_and_the_job_exits_93(tmp_path, monkeypatch, capsys):
    rc, lines = _standby_case(tmp_path, monkeypatch, None, (), wait_s=1.0)
    assert rc == EXIT_SDC_VERDICT
    assert lines[0] == "train 0 n1,n2,n3 " and not [line for line in lines if line.startswith("train 1")]
    out = capsys.readouterr().out
    assert "stopping the standby (no directive in time)" in out and "exit 93 (full relaunch)" in out


def test_a_step_that_alerts_but_ends_without_the_verdict_stops_its_standby(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RC", "1")  # e.g. the verdict's exit lost to a crash: the job ends with it
    rc, lines = _standby_case(tmp_path, monkeypatch, None, ())
    assert rc == 1
    assert lines == ["train 0 n1,n2,n3 ", "standby 1 n1,n3,n4", "end 0"]
    assert "stopping the standby (attempt 0 ended with 1, not the verdict)" in capsys.readouterr().out


def test_a_standby_at_the_verdict_starts_after_the_alerting_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_HOLD_S", "1")  # the step holds a while after its alert; no standby comes
    rc, lines = _standby_case(tmp_path, monkeypatch, ("n1", "n3", "n4"), ("n2",), standby_at="verdict")
    assert rc == 0
    assert lines == ["train 0 n1,n2,n3 ", "end 0", "standby 1 n1,n3,n4", f"train 1 n1,n3,n4 {CKPT}"]
    assert "raised an alert while its step ends" not in capsys.readouterr().out


def test_the_wait_for_the_directive_goes_on_through_a_store_outage(tmp_path, capsys):
    """A store outage while the supervisor waits is no refusal (a fault-matrix cell saw the job give its
    spare up and end over one): it looks again until the directive is there, within its wait."""
    store = LocalDirStore(tmp_path / "store")
    d = Directive(run="su", job_id="5", attempt=1, nodes=("n1", "n3", "n4"), resume_from="runs/su/checkpoints/step-00000010/",
                  incident_id="i", exclude=("n2",), issued_at=time.time())  # fmt: skip
    put_json(store, store_key("su", d.relative_path), d.to_json())
    down = OutageStore(store, down=5)
    sup = Supervisor(run="su", job_id="5", width=3, spares=1, wait_s=60.0, poll_s=0.01, step="true",
                     store=down, nodes_now=lambda: ["n1", "n3", "n4"])  # fmt: skip
    assert sup.wait_for_directive(1) == d
    assert down.refused == 5
    assert "store unavailable, still waiting for the directive" in capsys.readouterr().out
    # a directive that does not read is still refused at once
    store.put_bytes(store_key("su", d.relative_path), b"{not json")
    assert sup.wait_for_directive(1) is None
