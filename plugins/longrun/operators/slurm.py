"""SlurmSubmitJobOperator: submit a Slurm batch job and wait for it without holding a worker slot.

`execute` goes through Airflow 3.3's ResumableJobMixin: the job id is stored in the task state store
before waiting, so a retried try reattaches to a still-active (or already successful) job instead of
submitting it again. Because the worker can die between `sbatch` and storing the id, `submit_job` also
looks for a job carrying this task instance's tag (`--comment`, any try) before it submits.

Terminal outcomes (the job failed, was cancelled, timed out, used up its restarts, or exited with the
SDC verdict code) raise AirflowFailException with Slurm's state, reason and exit code: no retry.
Retryable ones (node failure, preemption) raise JobRetryableError, so the task's retries apply; a
retry after a terminal outcome (Airflow can retry for reasons of its own) fails with the first job's
verdict instead of submitting again.

Templated integer fields (`"nodes": "{{ params.nodes }}"`) need the DAG's
`render_template_as_native_obj=True`: JobSpec refuses the string "2" where it wants a number.
`on_kill` cancels the job while the task runs on a worker; a task marked failed while deferred leaves
the job running (Airflow calls no operator code then): cancel it with the hook or `scancel`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
from airflow.sdk.exceptions import AirflowFailException

from longrun.hooks.slurm import SlurmHook
from longrun.slurm import ops
from longrun.slurm.errors import JobNotFoundError, SlurmUnavailableError, TerminalSlurmError
from longrun.slurm.models import ACTIVE, JobState, JobStatus
from longrun.slurm.outcomes import Kind, Outcome, classify
from longrun.slurm.spec import JobSpec, JobTag
from longrun.triggers.slurm import SlurmJobTrigger

_ACTIVE = {s.value for s in ACTIVE}
#: The task state store's key for "a submission was begun with this tag prefix" (set before sbatch).
SUBMITTING_KEY = "slurm_submitting"


def tag_for(context: Mapping[str, Any]) -> JobTag:
    """This task instance's tag (dag/run/task/map index/try)."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return JobTag(
        dag_id=ti.dag_id,
        run_id=ti.run_id,
        task_id=ti.task_id,
        map_index=-1 if map_index is None else int(map_index),
        try_number=int(ti.try_number or 1),
    )


def finish(hook: SlurmHook, event: Any, *, max_restarts: int | None) -> JobState:
    """Validate a trigger event, re-check the job through the hook, and return its state on success.

    Raises AirflowFailException for terminal outcomes and JobRetryableError / SlurmUnavailableError for
    retryable ones (Airflow's retries apply). Shared by the operator and the sensor.
    """
    if not isinstance(event, dict) or "status" not in event or "job_id" not in event:
        raise AirflowFailException(f"malformed Slurm trigger event: {event!r}")
    job_id = int(event["job_id"])
    if event["status"] == "error":
        msg = f"Slurm trigger for job {job_id} failed: {event.get('message')}"
        if event.get("retryable"):
            raise SlurmUnavailableError(msg)
        raise AirflowFailException(msg)
    if event["status"] != "done":
        raise AirflowFailException(f"unknown Slurm trigger event status {event['status']!r}: {event!r}")
    # The event is what the triggerer saw; the hook's look is the one we act on.
    try:
        outcome: Outcome = hook.outcome(job_id, max_restarts=max_restarts)
    except JobNotFoundError:
        outcome = classify(JobState.from_dict(event["state"]), max_restarts=max_restarts)
    if outcome.label == "restarts_exhausted" and outcome.state.is_active:
        hook.cancel(job_id)
    if outcome.kind is Kind.RUNNING:
        raise SlurmUnavailableError(f"trigger reported job {job_id} final but Slurm says {outcome.message}")
    try:
        return hook.check(outcome)
    except TerminalSlurmError as err:
        raise AirflowFailException(str(err)) from err


class SlurmSubmitJobOperator(ResumableJobMixin, BaseOperator):
    """Submit a job from a JobSpec's fields (`job`, templated; `comment` is set here) and wait for it.

    With `wait_for_completion=False` it returns the job id right after submitting (pair it with
    SlurmJobSensor). Otherwise it defers to SlurmJobTrigger and returns the final job state as a dict.
    With `alert_signing_run` (templated: the run name), the job is a training job of that run: it gets
    a per-job alert key and the job identity's store credentials (`longrun.alert_auth.submit_env`).
    """

    template_fields: Sequence[str] = ("job", "alert_signing_run")
    external_id_key = "slurm_job_id"
    ui_color = "#d6e9f8"

    def __init__(
        self,
        *,
        job: dict[str, Any],
        slurm_conn_id: str = SlurmHook.default_conn_name,
        wait_for_completion: bool = True,
        poll_interval: float = 1.0,
        max_poll_interval: float = 10.0,
        max_restarts: int | None = None,
        alert_signing_run: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.alert_signing_run = alert_signing_run
        if "comment" in job:
            raise ValueError("job['comment'] is set by the operator (the dag/run/task/try tag); remove it")
        self.job = job
        self.slurm_conn_id = slurm_conn_id
        self.wait_for_completion = wait_for_completion
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.max_restarts = max_restarts
        self._job_id: int | None = None
        self._tag_prefix: str | None = None
        """This task instance's tag (set once it submitted or reattached): what its job carries."""
        if "{{" not in repr(job):
            # Fail at parse time, not at run time, when nothing is templated.
            JobSpec.from_dict({**job, "comment": "longrun/parse/check/t/-1/1"})

    @cached_property
    def hook(self) -> SlurmHook:
        return SlurmHook(self.slurm_conn_id)

    def execute(self, context: Any) -> Any:
        try:
            return self.execute_resumable(context)
        except TerminalSlurmError as err:
            raise AirflowFailException(str(err)) from err

    # -- ResumableJobMixin --------------------------------------------------------------------------
    def _earlier(self, context: Any, tag: JobTag) -> JobState | None:
        """The newest job of an earlier try: the stored id (jobcomp still knows it after slurmctld
        forgot it), or, only after a try that began a submission (`SUBMITTING_KEY`, stored before sbatch),
        a job carrying this task instance's tag (that try may have died before the id was stored). The tag
        alone is never believed otherwise: it is Slurm's public `--comment`, which any job can carry, and
        a DAG run id can be predicted (a scheduled run's), so a job planted with it would be adopted."""
        store = context.get("task_state_store")
        began = store is not None and store.get(SUBMITTING_KEY) == tag.prefix()
        seen = {s.job_id: s for s in self.hook.find_jobs(tag.prefix())} if began else {}
        stored = store.get(self.external_id_key) if store is not None else None
        if stored and int(stored) not in seen:
            try:
                state = self.hook.job_state(int(stored))
            except JobNotFoundError:
                state = None
            # A stored id may name another job by now: Slurm gives a lost job's id to the next submission
            # (a slurmctld that died before saving it). That job is never reattached to, or bound to a key.
            if state is not None and not self._not_ours(state, tag.prefix()):
                seen[int(stored)] = state
        return seen[max(seen)] if seen else None

    def _not_ours(self, state: JobState, tag_prefix: str) -> str | None:
        """Why `state` is not this task's job (another job now holds its id), or None (`ops.not_the_job`)."""
        return ops.not_the_job(state, tag_prefix=tag_prefix, name=str(self.job.get("name") or ""))

    def submit_job(self, context: Any) -> int:
        tag = tag_for(context)
        self._tag_prefix = tag.prefix()
        spec = JobSpec.from_dict({**self.job, "comment": tag.render()})
        earlier = self._earlier(context, tag)
        if earlier is not None:
            outcome = classify(earlier, max_restarts=self.max_restarts)
            if outcome.kind in (Kind.RUNNING, Kind.SUCCESS):
                self.log.info(
                    "Reattaching to Slurm job %s of an earlier try: %s", earlier.job_id, earlier.describe()
                )
                self._job_id = earlier.job_id
                if self.alert_signing_run and earlier.comment:
                    # The try that submitted it may have died before binding its key to the job id, and
                    # the key is found through that binding only (longrun.alert_auth.job_key).
                    from longrun import alert_auth
                    from training.store.factory import store_from_env

                    run = str(self.alert_signing_run)
                    alert_auth.bind(store_from_env(), run=run, tag=earlier.comment, job_id=earlier.job_id)
                return earlier.job_id
            if outcome.kind is Kind.TERMINAL:
                # A retry must not resubmit a job that failed on its own (Airflow can retry a task for
                # reasons of its own, e.g. apache/airflow#71580): fail with the first job's verdict.
                self.hook.check(outcome)
            self.log.info("Earlier Slurm job ended retryably (%s): submitting again", outcome.message)
        if (store := context.get("task_state_store")) is not None:
            store.set(SUBMITTING_KEY, tag.prefix())  # before sbatch: a retry may then look for the tag
        if self.alert_signing_run:
            # A training job: its alert key and store credentials go to sbatch's environment by name,
            # never into the spec (XCom), the script or this log.
            from longrun import alert_auth
            from training.store.factory import store_from_env

            run, store = str(self.alert_signing_run), store_from_env()
            secrets = alert_auth.submit_env(store, run=run, tag=spec.comment, env=os.environ)
            self._job_id = self.hook.submit(spec, secret_env=secrets)
            alert_auth.bind(store, run=run, tag=spec.comment, job_id=self._job_id)
        else:
            self._job_id = self.hook.submit(spec)
        self.log.info("Submitted Slurm job %s with tag %s", self._job_id, spec.comment)
        return self._job_id

    def get_job_status(self, external_id: Any, context: Any) -> str:
        """The stored job's status, read by the mixin to decide whether to reconnect; UNKNOWN (submit
        again) when Slurm does not know the id, or when the id names another job by now (Slurm gives a
        lost job's id to the next submission)."""
        try:
            state = self.hook.job_state(int(external_id))
        except JobNotFoundError:
            return JobStatus.UNKNOWN.value
        if why := self._not_ours(state, tag_for(context).prefix()):
            self.log.warning("The stored Slurm job id is no longer this task's job: %s", why)
            return JobStatus.UNKNOWN.value
        return state.status.value

    def is_job_active(self, status: str) -> bool:
        return status in _ACTIVE

    def is_job_succeeded(self, status: str) -> bool:
        return status == JobStatus.COMPLETED.value

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        job_id = self._job_id = int(external_id)
        context["ti"].xcom_push(key="slurm_job_id", value=job_id)
        if not self.wait_for_completion:
            return
        self.defer(
            trigger=SlurmJobTrigger(
                job_id=job_id,
                poll_interval=self.poll_interval,
                max_poll_interval=self.max_poll_interval,
                max_restarts=self.max_restarts,
                **self.hook.trigger_kwargs(),
            ),
            method_name="execute_complete",
            timeout=self.execution_timeout if isinstance(self.execution_timeout, timedelta) else None,
        )

    def get_job_result(self, external_id: Any, context: Any) -> Any:
        job_id = int(external_id)
        if not self.wait_for_completion:
            return job_id
        state = self.hook.check(classify(self.hook.job_state(job_id), max_restarts=self.max_restarts))
        return state.to_dict()

    # -- after the trigger fired --------------------------------------------------------------------
    def execute_complete(self, context: Any, event: Any = None) -> dict[str, Any]:
        if isinstance(event, dict) and "job_id" in event:
            self._job_id = int(event["job_id"])
        state = finish(self.hook, event, max_restarts=self.max_restarts)
        self.log.info("Slurm %s", state.describe())
        return state.to_dict()

    def on_kill(self) -> None:
        if self._job_id is None:
            return
        try:
            state = self.hook.job_state(self._job_id)
        except JobNotFoundError:
            return
        if self._tag_prefix and (why := self._not_ours(state, self._tag_prefix)):
            self.log.warning(
                "Not cancelling Slurm job %s: %s (Slurm lost this task's job)", self._job_id, why
            )
            return
        self.log.info("Cancelling Slurm job %s", self._job_id)
        self.hook.cancel(self._job_id)


__all__ = ["SlurmSubmitJobOperator", "finish", "tag_for"]
