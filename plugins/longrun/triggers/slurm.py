"""SlurmJobTrigger: waits in the triggerer until a Slurm job is final.

It lives in the installed package, not in dags/: the triggerer cannot import trigger classes from DAG
files. Every blocking call runs in a thread (`asyncio.to_thread`), polling backs off from
`poll_interval` to `max_poll_interval` while nothing changes, and any failure becomes an `error` event:
the task decides what it means. `cleanup` is not overridden: it runs on every triggerer restart, so it
must never cancel the job.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import RetryableSlurmError
from longrun.slurm.factory import make_client
from longrun.slurm.outcomes import Kind, classify


class SlurmJobTrigger(BaseTrigger):
    """Fires once with `{"status": "done", ...}` when the job is final, or `{"status": "error", ...}`."""

    def __init__(
        self,
        *,
        job_id: int,
        slurm_conf: str | None = None,
        backend: str = "cli",
        poll_interval: float = 1.0,
        max_poll_interval: float = 10.0,
        max_restarts: int | None = None,
        max_consecutive_errors: int = 30,
    ) -> None:
        super().__init__()
        self.job_id = int(job_id)
        self.slurm_conf = slurm_conf
        self.backend = backend
        self.poll_interval = float(poll_interval)
        self.max_poll_interval = float(max_poll_interval)
        self.max_restarts = max_restarts
        self.max_consecutive_errors = int(max_consecutive_errors)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_id": self.job_id,
                "slurm_conf": self.slurm_conf,
                "backend": self.backend,
                "poll_interval": self.poll_interval,
                "max_poll_interval": self.max_poll_interval,
                "max_restarts": self.max_restarts,
                "max_consecutive_errors": self.max_consecutive_errors,
            },
        )

    def _error(self, message: str, *, retryable: bool) -> TriggerEvent:
        return TriggerEvent(
            {"status": "error", "job_id": self.job_id, "retryable": retryable, "message": message}
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            client: SlurmClient = await asyncio.to_thread(
                make_client, backend=self.backend, slurm_conf=self.slurm_conf
            )
        except Exception as err:
            retryable = isinstance(err, RetryableSlurmError)
            yield self._error(f"cannot reach Slurm: {type(err).__name__}: {err}", retryable=retryable)
            return
        delay, errors, last = self.poll_interval, 0, None
        while True:
            try:
                state = await asyncio.to_thread(client.job, self.job_id)
            except RetryableSlurmError as err:
                errors += 1
                self.log.warning("Slurm query failed (%d/%d): %s", errors, self.max_consecutive_errors, err)
                if errors >= self.max_consecutive_errors:
                    yield self._error(f"Slurm did not answer {errors} times: {err}", retryable=True)
                    return
                await asyncio.sleep(delay)
                continue
            except Exception as err:
                yield self._error(f"{type(err).__name__}: {err}", retryable=False)
                return
            errors = 0
            outcome = classify(state, max_restarts=self.max_restarts)
            if outcome.kind is not Kind.RUNNING:
                yield TriggerEvent(
                    {
                        "status": "done",
                        "job_id": self.job_id,
                        "outcome": outcome.kind.value,
                        "label": outcome.label,
                        "message": outcome.message,
                        "state": state.to_dict(),
                    }
                )
                return
            # Back off while nothing changes; look again soon after a change (a requeue, a start).
            key = (state.status, state.restart_count, state.nodes)
            delay = self.poll_interval if key != last else min(delay * 2, self.max_poll_interval)
            if key != last:
                self.log.info("Slurm %s", state.describe())
            last = key
            await asyncio.sleep(delay)
