"""RunMonitorTrigger: watches a training job from the triggerer until something needs a worker.

It lives in the installed package (the triggerer cannot import triggers from dags/). Each look
(`watch.look`: Slurm job state, alerts/, new manifests, progress age) runs in a thread, so the event loop
never blocks. Polling starts at `poll_s` and backs off to `max_poll_s` while nothing moves; any progress
brings it back to `poll_s`. Failures become an `error` event (never an exception out of `run()`); Slurm
hiccups are retried `max_errors` times first. An unreachable store is watched through (back-off, a log
line per look) for as long as it lasts, and the heartbeat's stale clock restarts when it answers again. `cleanup` is not overridden: it runs on every
triggerer restart and must never touch the job.

An object under the run's `alerts/` that is not an alert (not JSON, not the alert record) is recorded as a
security event here and passed over; it never ends the watch.

A checkpoint or job_done event is held until `settle_s` after the trigger started (see
`CHECKPOINT_SETTLE_S`); an alert, a stale heartbeat or an error fires at once. While an event is held the
trigger keeps looking every `poll_s`, so an alert that comes meanwhile still fires at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from longrun.monitor import watch
from longrun.monitor.event import Carry, MonitorEvent
from longrun.slurm.errors import RetryableSlurmError
from longrun.slurm.factory import make_client
from training.store.factory import store_from_env
from training.store.interface import StoreUnavailable

#: Seconds after the trigger started before it fires a checkpoint or job_done event. Why: Airflow 3.3.2's
#: deferral race (apache/airflow#71580, #72716; docs/reliability.md). When the monitor defers, the worker
#: that ran that try reports the try's end to the scheduler only after its supervisor has returned; if the
#: trigger fires and the resumed try is already queued or running before the scheduler has handled that
#: report, the scheduler fails the resumed try ("state mismatch") and a retry is spent. Every checkpoint
#: resumes the monitor, so with checkpoints seconds apart (or a job ending right after its last
#: checkpoint) the race spends retries out of a per-task-instance budget that only shrinks. In the chaos
#: cells the trigger fired within seconds of the deferral, and without this hold on the loaded 2-core CI
#: host a resumed try was queued 6 s after its deferral with the worker's report 0.05 s behind
#: (tests/monitor/test_monitor_retry_budget.py); the scheduler handles a worker's report in its next loop
#: (about a second idle, a few seconds on a loaded host). 15 s is several such loops, and it costs
#: little: a checkpoint is promoted at most 15 s later than it would be (a production run checkpoints
#: minutes apart), and checkpoints closer together than that are promoted one per wake-up, so about one
#: per 15 s plus a resume. Alerts are never held: recovery time is unchanged.
CHECKPOINT_SETTLE_S = 15.0

#: Events held until the settle time has passed (the others fire at once). A job that ended without
#: records is a job end like job_done.
HELD = frozenset({watch.CHECKPOINT, watch.JOB_DONE, watch.NO_RECORDS})


def event_json(fields: Mapping[str, Any], seen: watch.Seen, carry: Carry) -> dict[str, Any]:
    """The event of `fields` (one `watch` event, or an error) with what every event carries, written by
    the type the operator reads it with (`MonitorEvent`): each field where the look put it, a null kept,
    then seen, carry, at. The trigger fires it; the operator builds one from its own look the same way."""
    declared = {k: v for k, v in fields.items() if k in MonitorEvent.FIELDS}
    event = MonitorEvent(
        **declared,
        seen=seen,
        carry=carry,
        at=time.time(),
        as_read={k: None for k, v in declared.items() if v is None},
        extra={k: v for k, v in fields.items() if k not in MonitorEvent.FIELDS},
    )
    return event.to_json()


class RunMonitorTrigger(BaseTrigger):
    """Fires once with one `watch` event (alert, checkpoint, job_done, stale) or an error event.

    Every event carries `seen` (what the monitor has handled, as plain values) so the operator can defer
    again with it, and `carry` (opaque plain values the operator keeps across deferrals)."""

    def __init__(
        self,
        *,
        seen: dict[str, Any],
        carry: dict[str, Any] | None = None,
        slurm_conf: str | None = None,
        backend: str = "cli",
        poll_s: float = 1.0,
        max_poll_s: float = 10.0,
        max_errors: int = 30,
        settle_s: float = CHECKPOINT_SETTLE_S,
    ) -> None:
        super().__init__()
        self.seen = dict(seen)
        self.carry = dict(carry or {})
        # Read here, where the operator defers (a malformed one fails the task there), not in run().
        self._seen = watch.seen_from_dict(self.seen)
        self._carry = Carry.from_json(self.carry)
        self.slurm_conf = slurm_conf
        self.backend = backend
        self.poll_s = float(poll_s)
        self.max_poll_s = float(max_poll_s)
        self.max_errors = int(max_errors)
        self.settle_s = float(settle_s)

    #: How the loop reads time for the settle hold and how it waits (a test drives the loop with its own;
    #: neither is serialised).
    _clock: Callable[[], float] = staticmethod(time.monotonic)
    _sleep: Callable[[float], Awaitable[None]] = staticmethod(asyncio.sleep)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "seen": self.seen,
                "carry": self.carry,
                "slurm_conf": self.slurm_conf,
                "backend": self.backend,
                "poll_s": self.poll_s,
                "max_poll_s": self.max_poll_s,
                "max_errors": self.max_errors,
                "settle_s": self.settle_s,
            },
        )

    def _event(self, **fields: Any) -> TriggerEvent:
        return TriggerEvent(event_json(fields, self._seen, self._carry))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Look until there is an event to fire, then fire it (one event; the module docstring says when).

        Why one function: it is one polling loop whose branches (store outage, Slurm hiccup, failure, bad
        alert, held event, back-off) each end in yield-and-return, `continue` or the next sleep, and share
        the loop's state (seen, delay, error count, outage start, the held-event log). Moved into helpers,
        each would have to hand that state and its control flow back to the loop."""
        seen = self._seen
        started = self._clock()
        held_logged = False
        try:
            client = await asyncio.to_thread(make_client, backend=self.backend, slurm_conf=self.slurm_conf)
            store = await asyncio.to_thread(store_from_env)
        except Exception as err:
            yield self._event(type=watch.ERROR, retryable=True, message=f"{type(err).__name__}: {err}")
            return
        delay, errors, last = self.poll_s, 0, None
        outage_since: float | None = None  # the store has not answered since then
        while True:
            try:
                event, activity = await asyncio.to_thread(watch.look, store, client, seen)
            except StoreUnavailable as err:
                # An unreachable store is not a dead run: the job may train on (its uploads retry and
                # its alert waits for the store). Keep watching, back off, and say so; never count it
                # towards max_errors.
                now = time.time()
                outage_since = outage_since or now
                delay = min(self.max_poll_s, delay * 2)
                self.log.warning(
                    "store unreachable for %.0f s; still watching run %s, job %s (next look in %.1f s): %s",
                    now - outage_since,
                    seen.run,
                    seen.job_id,
                    delay,
                    err,
                )
                await self._sleep(delay)
                continue
            except RetryableSlurmError as err:
                errors += 1
                self.log.warning("monitor look failed (%d/%d): %s", errors, self.max_errors, err)
                if errors >= self.max_errors:
                    yield self._event(
                        type=watch.ERROR, retryable=True, message=f"{errors} failed looks: {err}"
                    )
                    return
                await self._sleep(min(self.max_poll_s, delay * 2))
                continue
            except Exception as err:
                yield self._event(type=watch.ERROR, retryable=False, message=f"{type(err).__name__}: {err}")
                return
            errors = 0
            if outage_since is not None:
                # Heartbeats could not reach the store during the outage: the stale clock restarts now,
                # else the first look after it would call a training job stale.
                self.log.warning("store reachable again after %.0f s", time.time() - outage_since)
                seen = replace(seen, since=time.time())
                outage_since = None
                if event is not None and event.get("type") == watch.STALE:
                    event = None
            if event is not None and event.get("type") == watch.BAD_ALERT:
                # Not an alert: a security event, and the watch goes on (a job can write under alerts/;
                # what it writes there must never end the monitor). The passed-over key rides along in
                # the next event's `seen`, so a resumed monitor does not report it again.
                await asyncio.to_thread(watch.record_bad_alert, store, seen, event)
                seen = watch.handled(seen, event)
                self._seen = watch.handled(self._seen, event)
                self.seen = watch.seen_to_dict(self._seen)
                continue
            if event is not None:
                wait = self.settle_s - (self._clock() - started) if event.get("type") in HELD else 0.0
                if wait <= 0:
                    yield self._event(**event)
                    return
                if not held_logged:
                    self.log.info(
                        "run %s: %s event (step %s) held %.1f s more: the scheduler settles the deferral first",
                        seen.run,
                        event.get("type"),
                        event.get("step"),
                        wait,
                    )
                    held_logged = True
                # Look again soon: an alert that comes while this one is held still fires at once.
                await self._sleep(min(wait, self.poll_s))
                continue
            # Back off only while the job is not running (pending, or Slurm slow to show it): while it
            # runs an alert can come at any look, and the progress record changes only every few seconds,
            # which used to stretch the wait for an alert to 3.4 s.
            moving = activity != last or watch.job_running(activity)
            delay = self.poll_s if moving else min(delay * 1.5, self.max_poll_s)
            if activity != last:
                self.log.info("run %s: job %s %s, step %s", seen.run, seen.job_id, activity[0], activity[1])
            last = activity
            await self._sleep(delay)
