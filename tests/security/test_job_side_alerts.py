"""Records a job writes never stop or fail a run (issue 28, item 4).

The attack: a job identity (any job, anything running in one) writes records under a run's `alerts/`.
Before, the job's launch wrapper (`python -m training.nvrx launch-verdict`) counted a forged alert as
this launch's verdict and turned ft_launcher's exit 0 into 93, the in-job restart check
(`verdict_already_given`) stopped a restarted incarnation, the hot-spare supervisor's `AlertWatch`
started a standby on a forged suspect, and an object under `alerts/` that is not an alert ended the
monitor with a non-retryable error.

Now every reader in the job counts only alerts signed with this job's key (`LONGRUN_ALERT_KEY`) that
name this run and this job (`training.records.signing.alert_not_mine`), and the monitor records a security event
for an unreadable or non-alert object and keeps watching. Pure Python: a local store, no Slurm.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from training.events import write_durably
from training.launch_records import LAUNCH_T0_ENV
from training.nvrx import adapter as nvrx
from training.nvrx.restart import verdict_already_given
from training.records import schema, signing
from training.spares.standby import AlertWatch
from training.store.interface import put_json
from training.store.local import LocalDirStore

RUN, JOB = "r", 4242
KEY = signing.new_key()


def _alert(step: int, t: float, *, node: str = "n2", run: str = RUN) -> dict[str, Any]:
    return schema.record(
        "alert",
        run=run,
        step=step,
        check="finite",
        suspect_ranks=[1],
        suspect_nodes=[node],
        evidence={},
        time=t,
    )


def genuine(step: int, t: float, *, node: str = "n2") -> dict[str, Any]:
    """As the trainer's EventWriter writes it inside job JOB: with the job id, signed with its key."""
    return signing.sign({**_alert(step, t, node=node), "job_id": JOB}, KEY)


def forgeries(t: float) -> dict[str, dict[str, Any]]:
    """What another job (or anything running in one) can write under this run's alerts/."""
    return {
        "forged": signing.sign({**_alert(11, t, node="n1"), "job_id": JOB}, signing.new_key()),
        "other-job": signing.sign({**_alert(12, t, node="n3"), "job_id": JOB + 1}, KEY),
        "other-run": signing.sign({**_alert(13, t, node="n3", run="other"), "job_id": JOB}, KEY),
        "unsigned": {**_alert(14, t, node="n4"), "job_id": JOB},
    }


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's environment as sbatch exports it: its key and its Slurm job id."""
    monkeypatch.setenv(signing.KEY_ENV, KEY.hex())
    monkeypatch.setenv("SLURM_JOB_ID", str(JOB))


def _write(run_dir: Path, store: LocalDirStore, name: str, alert: dict[str, Any], *, where: str) -> None:
    relative = schema.alert_path(int(alert["step"]), "finite", name)
    if where == "run_dir":
        write_durably(run_dir / relative, alert)
    else:
        put_json(store, schema.store_key(RUN, relative), alert)


def _verdict(run_dir: Path, store_dir: Path, since: float, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv("LONGRUN_STORE_DIR", str(store_dir))
    monkeypatch.delenv("LONGRUN_ORCH_STORE_DIR", raising=False)
    for var in ("AWS_ENDPOINT_URL", "LONGRUN_S3"):
        monkeypatch.delenv(var, raising=False)
    argv = ["launch-verdict", "--run-dir", str(run_dir), "--run", RUN, "--since", str(since), "--store"]
    return nvrx.main(argv)


# ---- (a) the launch wrapper ----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["run_dir", "store"])
def test_launch_verdict_counts_no_forged_foreign_or_unsigned_alert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyed: None, where: str, caplog: Any
) -> None:
    run_dir, store = tmp_path / "run", LocalDirStore(tmp_path / "store")
    now = time.time()
    for name, alert in forgeries(now + 1).items():
        _write(run_dir, store, name, alert, where=where)
    caplog.set_level(logging.WARNING)
    assert _verdict(run_dir, tmp_path / "store", now, monkeypatch) == 1  # no verdict: ft_launcher's code
    warned = caplog.text
    for name in forgeries(now):
        assert f"-{name}.json" in warned  # each ignored one is named
    _write(run_dir, store, "genuine", genuine(20, now + 2), where=where)
    assert _verdict(run_dir, tmp_path / "store", now, monkeypatch) == 0  # the verdict


def test_without_a_key_every_alert_counts_as_before_and_it_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    run_dir, store = tmp_path / "run", LocalDirStore(tmp_path / "store")
    now = time.time()
    _write(run_dir, store, "unsigned", _alert(5, now + 1), where="run_dir")
    caplog.set_level(logging.INFO)
    assert _verdict(run_dir, tmp_path / "store", now, monkeypatch) == 0
    assert f"no {signing.KEY_ENV}" in caplog.text


# ---- (b) the in-job restart check and the supervisor's alert watch -------------------------------------


@pytest.mark.parametrize("where", ["run_dir", "store"])
def test_a_restarted_incarnation_is_not_stopped_by_a_forged_alert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyed: None, where: str
) -> None:
    run_dir, store = tmp_path / "run", LocalDirStore(tmp_path / "store")
    now = time.time()
    monkeypatch.setenv(LAUNCH_T0_ENV, f"{now:.6f}")
    for name, alert in forgeries(now + 1).items():
        _write(run_dir, store, name, alert, where=where)
    assert verdict_already_given(restart_count=1, run_dir=run_dir, run=RUN, store=store) is None
    _write(run_dir, store, "genuine", genuine(20, now + 2), where=where)
    found = verdict_already_given(restart_count=1, run_dir=run_dir, run=RUN, store=store)
    assert found is not None and found.endswith("-genuine.json")


def test_the_alert_watch_predicts_from_this_jobs_alerts_only(tmp_path: Path, keyed: None) -> None:
    store = LocalDirStore(tmp_path / "store")
    now = time.time()
    watch = AlertWatch(store, RUN, since=now - 10)
    for name, alert in forgeries(now).items():
        _write(tmp_path, store, name, alert, where="store")
    store.put_bytes(schema.store_key(RUN, "alerts/00000015-finite-junk.json"), b"not json")
    assert watch.suspects() == set()  # no standby started on a forged suspect
    _write(tmp_path, store, "genuine", genuine(20, now, node="n2"), where="store")
    assert watch.suspects() == {"n2"}


def test_the_rule_is_one_function() -> None:
    mine = signing.ThisJob(key=KEY, job_id=JOB)
    now = time.time()
    assert signing.alert_not_mine(genuine(1, now), job=mine, run=RUN) is None
    reasons = {n: signing.alert_not_mine(a, job=mine, run=RUN) for n, a in forgeries(now).items()}
    assert reasons == {
        "forged": "bad_signature",
        "other-job": "other_job",
        "other-run": "other_run",
        "unsigned": "unsigned",
    }
    assert signing.alert_not_mine([1], job=mine, run=RUN) == "not_an_object"
    # without a key: today's behaviour, everything counts
    assert signing.alert_not_mine(forgeries(now)["forged"], job=signing.ThisJob(key=None), run=RUN) is None
    # an alert written where SLURM_JOB_ID was not set carries no job id: the signature still binds it
    no_id = signing.sign(_alert(2, now), KEY)
    assert signing.alert_not_mine(no_id, job=mine, run=RUN) is None


# ---- (c) the monitor -----------------------------------------------------------------------------------


class _Job:
    """A SlurmClient that knows one job, in one state (the state the test sets)."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def job(self, job_id: int) -> Any:
        return self.state


def _run_trigger(monkeypatch: pytest.MonkeyPatch, store: LocalDirStore, client: Any, seen: Any) -> Any:
    from longrun.monitor import trigger as trigger_mod
    from longrun.monitor import watch
    from longrun.monitor.event import MonitorEvent

    monkeypatch.setattr(trigger_mod, "make_client", lambda **kw: client)
    monkeypatch.setattr(trigger_mod, "store_from_env", lambda: store)
    t = trigger_mod.RunMonitorTrigger(seen=watch.seen_to_dict(seen), settle_s=0.0, poll_s=0.01)

    async def nap(s: float) -> None:
        await asyncio.sleep(0)

    t._sleep = nap  # type: ignore[method-assign]

    async def first() -> Any:
        async for ev in t.run():
            return ev
        raise AssertionError("the trigger ended without an event")

    return MonitorEvent.from_json(asyncio.run(asyncio.wait_for(first(), 30)).payload)


def test_the_monitor_passes_over_junk_under_alerts_and_records_security_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from longrun import security_events
    from longrun.monitor import watch
    from longrun.slurm.models import JobState, JobStatus

    store = LocalDirStore(tmp_path / "store")
    junk = {
        schema.store_key(RUN, "alerts/00000001-finite-garbage.json"): b"\xff not json {",
        schema.store_key(RUN, "alerts/00000002-finite-notalert.json"): b'{"kind": "progress", "step": 2}',
        schema.store_key(RUN, "alerts/00000003-finite-list.json"): b"[1, 2, 3]",
    }
    for key, raw in junk.items():
        store.put_bytes(key, raw)
    seen = watch.Seen(run=RUN, job_id=JOB, since=time.time())
    done = JobState(job_id=JOB, status=JobStatus.COMPLETED, slurm_state="COMPLETED", exit_code=0)
    ev = _run_trigger(monkeypatch, store, _Job(done), seen)
    # the watch went on to the job's real end, with the junk passed over
    assert (ev.type, ev.outcome) == (watch.JOB_DONE, "success")
    assert set(junk) <= set(ev.seen.alerts)
    events = security_events.events(store, RUN)
    assert sorted(e.details["alert_key"] for e in events) == sorted(junk)
    assert {e.reason for e in events} == {"unreadable_alert", "not_an_alert"}
    assert all(e.to_json()["runbook"] == security_events.RUNBOOK for e in events)

    # a real alert after the junk is still handed over, and the junk is not reported twice
    running = JobState(job_id=JOB, status=JobStatus.RUNNING, slurm_state="RUNNING")
    put_json(store, schema.store_key(RUN, "alerts/00000009-finite-real.json"), genuine(9, time.time()))
    ev = _run_trigger(monkeypatch, store, _Job(running), ev.seen)
    assert (ev.type, ev.alert_key) == (watch.ALERT, schema.store_key(RUN, "alerts/00000009-finite-real.json"))
    assert len(security_events.events(store, RUN)) == len(junk)
