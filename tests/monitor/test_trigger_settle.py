"""The trigger holds a checkpoint (and job_done) event until `settle_s` after it started, and fires an
alert, a stale heartbeat or an error at once (Airflow 3.3.2's deferral race, docs/reliability.md).

The trigger's loop is driven here with a fake clock and a fake sleep that advances it (no wall clock);
`watch.look` is replaced by a script of what the store and Slurm show at each fake time, because a look
needs a Slurm job and a store, and the point here is only when the trigger fires, not what a look reads
(real looks: tests/monitor/test_watch_slurm.py, tests/monitor/test_store_outage.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from longrun.monitor import trigger as trigger_mod
from longrun.monitor import watch
from longrun.monitor.event import MonitorEvent
from longrun.monitor.trigger import CHECKPOINT_SETTLE_S, HELD, RunMonitorTrigger
from longrun.slurm.models import JobStatus

T0 = 1000.0  # the fake clock's reading when the trigger starts
SEEN = watch.seen_to_dict(watch.Seen(run="r1", job_id=42, steps=(10,), since=1.0))
CHECKPOINT = {
    "type": watch.CHECKPOINT,
    "step": 20,
    "manifest_key": "runs/r1/checkpoints/step-00000020/manifest.json",
}
ALERT = {"type": watch.ALERT, "alert_key": "runs/r1/alerts/x.json", "alert": {"kind": "alert", "step": 21}}
JOB_DONE = {"type": watch.JOB_DONE, "outcome": "success", "label": None, "message": "COMPLETED", "state": {}}
STALE = {"type": watch.STALE, "age_s": 700.0, "progress": None, "message": "no progress"}


class Driven:
    """Runs a trigger to its one event on a fake clock; `looks` maps the fake seconds since the start to
    what `watch.look` returns then."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        looks: Callable[[float], dict[str, Any] | None],
        activity: tuple[str, int | None] = (JobStatus.RUNNING.value, 5),
    ) -> None:
        self.now = T0
        self.sleeps: list[float] = []
        self.looked_at: list[float] = []

        def look(store: Any, client: Any, seen: watch.Seen) -> tuple[dict[str, Any] | None, Any]:
            self.looked_at.append(self.now - T0)
            return looks(self.now - T0), activity

        monkeypatch.setattr(watch, "look", look)
        monkeypatch.setattr(trigger_mod, "make_client", lambda **kw: object())
        monkeypatch.setattr(trigger_mod, "store_from_env", lambda: object())

    async def _sleep(self, s: float) -> None:
        assert s > 0
        self.sleeps.append(s)
        self.now += s

    def fire(self, **kw: Any) -> tuple[MonitorEvent, float]:
        """(the one event, fake seconds after the start it fired at)."""
        t = RunMonitorTrigger(seen=SEEN, **kw)
        t._clock = lambda: self.now  # type: ignore[method-assign]
        t._sleep = self._sleep  # type: ignore[method-assign]

        async def first() -> Any:
            async for ev in t.run():
                return ev
            raise AssertionError("the trigger ended without an event")

        ev = asyncio.run(first())
        return MonitorEvent.from_json(ev.payload), self.now - T0


def test_a_checkpoint_is_held_until_the_settle_time_while_the_trigger_keeps_looking(monkeypatch) -> None:
    d = Driven(monkeypatch, lambda t: CHECKPOINT)
    ev, at = d.fire(settle_s=15.0, poll_s=1.0)
    assert (ev.type, ev.step) == (watch.CHECKPOINT, 20)
    assert at == 15.0
    # it looked again every poll_s while it held the checkpoint (an alert would have been seen)
    assert d.looked_at == [float(i) for i in range(16)]
    assert max(d.sleeps) == 1.0


def test_job_done_is_held_too(monkeypatch) -> None:
    d = Driven(monkeypatch, lambda t: JOB_DONE)
    ev, at = d.fire(settle_s=6.0, poll_s=2.5)
    assert ev.type == watch.JOB_DONE and at == 6.0
    assert d.sleeps == [2.5, 2.5, 1.0]  # the last wait is only what is left of the settle time


@pytest.mark.parametrize("event", [ALERT, STALE], ids=lambda e: e["type"])
def test_an_alert_or_a_stale_heartbeat_fires_at_once(monkeypatch, event: dict[str, Any]) -> None:
    d = Driven(monkeypatch, lambda t: event)
    ev, at = d.fire(settle_s=15.0)
    assert ev.type == event["type"] and at == 0.0 and d.sleeps == []


def test_an_alert_during_the_hold_fires_at_once_and_wins_over_the_held_checkpoint(monkeypatch) -> None:
    # As watch.look orders them: a new alert comes before a new checkpoint.
    d = Driven(monkeypatch, lambda t: ALERT if t >= 4.0 else CHECKPOINT)
    ev, at = d.fire(settle_s=15.0, poll_s=1.0)
    assert ev.type == watch.ALERT and at == 4.0


def test_an_error_fires_at_once(monkeypatch) -> None:
    def broken(t: float) -> dict[str, Any] | None:
        raise KeyError("x")

    d = Driven(monkeypatch, broken)
    ev, at = d.fire(settle_s=15.0)
    assert (ev.type, ev.retryable, at) == (watch.ERROR, False, 0.0)


def test_a_checkpoint_that_comes_after_the_settle_time_fires_at_once(monkeypatch) -> None:
    d = Driven(monkeypatch, lambda t: CHECKPOINT if t >= 40.0 else None)
    ev, at = d.fire(settle_s=15.0, poll_s=1.0, max_poll_s=5.0)
    assert ev.type == watch.CHECKPOINT
    assert at == d.looked_at[-1] and d.looked_at[-2] < 40.0 <= at  # the first look that saw it fired it


def test_settle_zero_fires_a_checkpoint_at_once(monkeypatch) -> None:
    d = Driven(monkeypatch, lambda t: CHECKPOINT)
    ev, at = d.fire(settle_s=0.0)
    assert ev.type == watch.CHECKPOINT and at == 0.0


def test_the_default_and_what_is_held() -> None:
    assert RunMonitorTrigger(seen=SEEN).settle_s == CHECKPOINT_SETTLE_S > 0
    assert HELD == {watch.CHECKPOINT, watch.JOB_DONE, watch.NO_RECORDS}  # the job ended: held like job_done
    path, kwargs = RunMonitorTrigger(seen=SEEN, settle_s=3).serialize()
    assert kwargs["settle_s"] == 3.0 and RunMonitorTrigger(**kwargs).settle_s == 3.0


def test_it_backs_off_only_while_the_job_is_not_running(monkeypatch) -> None:
    """A running job whose progress record has not changed is still looked at every poll_s (an alert can
    come at any look); a pending one is looked at less and less often, up to max_poll_s."""
    running = Driven(monkeypatch, lambda t: ALERT if t >= 12.0 else None)
    ev, at = running.fire(settle_s=0.0, poll_s=1.0, max_poll_s=5.0)
    assert ev.type == watch.ALERT and at == 12.0 and set(running.sleeps) == {1.0}
    pending = Driven(
        monkeypatch, lambda t: ALERT if t >= 12.0 else None, activity=(JobStatus.PENDING.value, None)
    )
    ev, at = pending.fire(settle_s=0.0, poll_s=1.0, max_poll_s=5.0)
    assert ev.type == watch.ALERT and max(pending.sleeps) > 1.0 and at > 12.0
