"""RunMonitorTrigger: watches a training job from the triggerer until something needs a worker.

It lives in the installed package (the triggerer cannot import triggers from dags/). Each look
(`watch.look`: Slurm job state, alerts/, new manifests, progress age) runs in a thread, so the event loop
never blocks. Polling starts at `poll_s` and backs off to `max_poll_s` while nothing moves; any progress
brings it back to `poll_s`. Failures become an `error` event (never an exception out of `run()`); Slurm
hiccups are retried `max_errors` times first. An unreachable store is watched through (back-off, a log
line per look) for as long as it lasts, and the heartbeat's stale clock restarts when it answers again. `cleanup` is not overridden: it runs on every
triggerer restart and must never touch the job.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from longrun.monitor import watch
from longrun.monitor.event import Carry, MonitorEvent
from longrun.slurm.client import make_client
from longrun.slurm.errors import RetryableSlurmError
from training.store import StoreUnavailable, store_from_env


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
            },
        )

    def _event(self, **fields: Any) -> TriggerEvent:
        """The event of `fields` (one `watch` event, or an error) with what every event carries, written
        by the type the operator reads it with (`MonitorEvent`): each field where the look put it, a null
        kept, then seen, carry, at."""
        declared = {k: v for k, v in fields.items() if k in MonitorEvent.READ}
        event = MonitorEvent(
            **declared,
            seen=self._seen,
            carry=self._carry,
            at=time.time(),
            nulls=frozenset(k for k, v in declared.items() if v is None),
            extra={k: v for k, v in fields.items() if k not in MonitorEvent.READ},
        )
        return TriggerEvent(event.to_json())

    async def run(self) -> AsyncIterator[TriggerEvent]:
        seen = self._seen
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
                await asyncio.sleep(delay)
                continue
            except RetryableSlurmError as err:
                errors += 1
                self.log.warning("monitor look failed (%d/%d): %s", errors, self.max_errors, err)
                if errors >= self.max_errors:
                    yield self._event(
                        type=watch.ERROR, retryable=True, message=f"{errors} failed looks: {err}"
                    )
                    return
                await asyncio.sleep(min(self.max_poll_s, delay * 2))
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
            if event is not None:
                yield self._event(**event)
                return
            delay = self.poll_s if activity != last else min(delay * 1.5, self.max_poll_s)
            if activity != last:
                self.log.info("run %s: job %s %s, step %s", seen.run, seen.job_id, activity[0], activity[1])
            last = activity
            await asyncio.sleep(delay)
