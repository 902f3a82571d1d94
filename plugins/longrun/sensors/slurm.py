"""SlurmJobSensor: wait for a Slurm job to finish, deferred by default (no worker slot while waiting)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException

from longrun.hooks.slurm import SlurmHook
from longrun.operators.slurm import finish
from longrun.slurm.errors import TerminalSlurmError
from longrun.slurm.outcomes import Kind
from longrun.triggers.slurm import SlurmJobTrigger


class SlurmJobSensor(BaseSensorOperator):
    """Succeeds when job `job_id` (templated) completes; fails with Slurm's state, reason and exit code
    when it ends otherwise (retryable endings raise an error Airflow's retries apply to)."""

    template_fields: Sequence[str] = ("job_id",)
    ui_color = "#d6e9f8"

    def __init__(
        self,
        *,
        job_id: int | str,
        slurm_conn_id: str = SlurmHook.default_conn_name,
        deferrable: bool = True,
        poll_interval: float = 1.0,
        max_poll_interval: float = 10.0,
        max_restarts: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_id = job_id
        self.slurm_conn_id = slurm_conn_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.max_restarts = max_restarts

    @cached_property
    def hook(self) -> SlurmHook:
        return SlurmHook(self.slurm_conn_id)

    def poke(self, context: Any) -> bool:
        outcome = self.hook.outcome(int(self.job_id), max_restarts=self.max_restarts)
        if outcome.kind is Kind.RUNNING:
            return False
        self.log.info("Slurm %s", outcome.state.describe())
        try:
            self.hook.check(outcome)
        except TerminalSlurmError as err:
            raise AirflowFailException(str(err)) from err
        return True

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        if self.poke(context):
            return None
        self.defer(
            trigger=SlurmJobTrigger(
                job_id=int(self.job_id),
                poll_interval=self.poll_interval,
                max_poll_interval=self.max_poll_interval,
                max_restarts=self.max_restarts,
                **self.hook.trigger_kwargs(),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)) if self.timeout else None,
        )

    def execute_complete(self, context: Any, event: Any = None) -> dict[str, Any]:
        state = finish(self.hook, event, max_restarts=self.max_restarts)
        self.log.info("Slurm %s", state.describe())
        return state.to_dict()
