"""RunMonitorOperator: watch a training job until it finishes or an alert hands it to `sdc_incident`.

execute         note what already exists (an earlier attempt's alerts, promoted steps), defer
execute_complete, one trigger event at a time:
    checkpoint  validate it, promote it if valid (never an invalid or suspect one), look once more from
                the worker (a further checkpoint, an alert or the job's end is handled at once), else
                defer again
    alert       stop watching; return the alert so the DAG hands it to sdc_incident
    job_done    remove the run's store identity (longrun.run_identity), then return the outcome
                (completed) or fail with Slurm's state and exit code
    stale       fail loudly: the heartbeat stopped while the job runs (runbook: stale heartbeat)
    launch_held fail loudly: Slurm holds the job after a failed launch (runbook: job held after a failed
                launch); released by an operator, a clear of the task watches the same job again
    no_records  fail, never retried: an entrypoint other than the reference trainer wrote no longrun
                record (it does not use training.api; docs/adopting.md)
    error       retryable -> raise so Airflow retries the task (it re-defers); else fail

Asset events: Airflow 3.3 registers a task's asset events when the task succeeds, not while it is
deferred, so each promotion is carried across deferrals and emitted, one event per checkpoint with its
metadata, through the `longrun_checkpoints` alias when the watch ends. The promotion itself (the pointer
in the store) happens at once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import Asset, AssetAlias, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from longrun import alert_auth, security_events
from longrun.checkpoints import catalog
from longrun.entrypoint import REFERENCE
from longrun.hooks.slurm import SlurmHook
from longrun.monitor import watch
from longrun.monitor.event import Carry, MonitorEvent
from longrun.monitor.gate import gate_checkpoint
from longrun.monitor.trigger import CHECKPOINT_SETTLE_S, RunMonitorTrigger, event_json
from longrun.run_identity import RunIdentityError, identities_from_env
from longrun.runbooks import runbook_path
from training.records import schema
from training.records.alert import Alert
from training.records.schema import SchemaError
from training.store.factory import store_from_env
from training.store.interface import ObjectStore

CHECKPOINTS_ALIAS = AssetAlias(name="longrun_checkpoints")
COMPLETED = "completed"
ALERTED = "alert"
#: The events the operator handles from its own look after gating a checkpoint, without deferring: what
#: the trigger would fire at once or after its settle hold. A stale heartbeat and the store-outage rules
#: stay the trigger's (they need its clock across looks).
INLINE = frozenset({watch.CHECKPOINT, watch.JOB_DONE, watch.ALERT})
#: Events handled that way in one try at most, then the trigger watches again (a backlog of checkpoints
#: is then gated one per deferral).
INLINE_MAX = 8


def checkpoint_asset(store: ObjectStore, run: str) -> Asset:
    """The asset standing for a run's promoted checkpoints (one event per promotion)."""
    bucket = getattr(store, "bucket", None)
    uri = (
        f"s3://{bucket}/runs/{run}/checkpoints/"
        if bucket
        else f"file://longrun-store/runs/{run}/checkpoints/"
    )
    return Asset(name=f"longrun_checkpoints_{run}", uri=uri)


class RunMonitorOperator(BaseOperator):
    """Watch `run_name`'s Slurm job `job_id` (both templated) from the triggerer.

    `checkpoint_settle_s`: how long after each deferral the trigger holds a checkpoint or job_done event
    (alerts are never held), so that a resume does not race the scheduler's handling of the deferral
    (`longrun.monitor.trigger.CHECKPOINT_SETTLE_S`)."""

    template_fields: Sequence[str] = ("run_name", "job_id")
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        run_name: str,
        job_id: Any,
        stale_after_s: float = 600.0,
        poll_s: float = 1.0,
        max_poll_s: float = 5.0,
        checkpoint_settle_s: float = CHECKPOINT_SETTLE_S,
        slurm_conn_id: str = SlurmHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("outlets", [CHECKPOINTS_ALIAS])
        super().__init__(**kwargs)
        self.run_name = run_name
        self.job_id = job_id
        self.stale_after_s = stale_after_s
        self.poll_s = poll_s
        self.max_poll_s = max_poll_s
        self.checkpoint_settle_s = checkpoint_settle_s
        self.slurm_conn_id = slurm_conn_id

    @cached_property
    def hook(self) -> SlurmHook:
        return SlurmHook(self.slurm_conn_id)

    @cached_property
    def store(self) -> ObjectStore:
        return store_from_env()

    def _defer(self, seen: watch.Seen, carry: Carry) -> None:
        self.defer(
            trigger=RunMonitorTrigger(
                seen=watch.seen_to_dict(seen),
                carry=carry.to_json(),
                poll_s=self.poll_s,
                max_poll_s=self.max_poll_s,
                settle_s=self.checkpoint_settle_s,
                **self.hook.trigger_kwargs(),
            ),
            method_name="execute_complete",
            timeout=self.execution_timeout if isinstance(self.execution_timeout, timedelta) else None,
        )

    def execute(self, context: Any) -> Any:
        run = str(self.run_name)
        job_id = int(str(self.job_id))
        done = catalog.promoted_steps(self.store, run)
        params = context.get("params") or {}
        if params.get("attach_job_id") is not None:
            # A relaunch saves every step after its resume point again: only those up to it are done.
            resumed = params.get("resume_from")
            upto = schema.step_of_manifest_key(f"{resumed.rstrip('/')}/manifest.json") if resumed else 0
            done = [s for s in done if upto is not None and s <= upto]
        # A retry hands over what an earlier try saw but did not hand over (only other jobs' alerts and
        # those an incident took are passed over).
        alerts, steps = watch.ignore_existing(
            self.store, run, done, job_id=job_id, continuation=params.get("attach_job_id") is not None
        )
        if alerts:
            self.log.info("ignoring %d alert(s) of earlier attempts: %s", len(alerts), list(alerts))
        entrypoint = str(params.get("entrypoint") or REFERENCE)
        seen = watch.Seen(
            run=run,
            job_id=job_id,
            steps=steps,
            alerts=alerts,
            stale_after_s=self.stale_after_s,
            since=time.time(),
            # the reference trainer's missing records keep their own paths (stale, the finish's report)
            entrypoint="" if entrypoint == REFERENCE else entrypoint,
        )
        self.log.info(
            "watching run %s, Slurm job %s (checkpoints already promoted: %s)", run, job_id, list(steps)
        )
        self._defer(seen, Carry())

    def _look_now(self, seen: watch.Seen, carry: Carry) -> dict[str, Any] | None:
        """One look from this worker right after a checkpoint was gated: the event the trigger would fire
        (`INLINE`), built as the trigger builds it, else None (defer). The job's end usually follows its
        last checkpoint by seconds, so this spares the run a deferral round (the trigger's settle hold,
        the scheduler's resume, a task start) just to learn what one look tells now. A look that fails
        (store or Slurm unreachable) is the trigger's to ride out: None."""
        try:
            fields, _activity = watch.look(self.store, self.hook.client, seen)
        except Exception as e:
            self.log.info(
                "look after the checkpoint failed (%s: %s); the trigger looks next", type(e).__name__, e
            )
            return None
        if fields is None or fields.get("type") not in INLINE:
            return None
        self.log.info(
            "run %s: %s seen right after the checkpoint; handled in this try", seen.run, fields["type"]
        )
        return event_json(fields, seen, carry)

    def execute_complete(self, context: Any, event: Any = None, *, _inline: int = 0) -> Any:
        try:
            ev = MonitorEvent.from_json(event)
        except SchemaError as e:
            raise AirflowFailException(f"malformed monitor event: {e}: {event!r:.2000}") from None
        seen, carry = ev.seen, ev.carry
        if ev.type == watch.CHECKPOINT:
            assert ev.step is not None  # MonitorEvent refuses a checkpoint event without one
            result = gate_checkpoint(self.store, seen.run, ev.step, log=self.log, by=_promoter(context))
            seen, carry = watch.handled(seen, event), carry.add(result)
            after = self._look_now(seen, carry) if _inline < INLINE_MAX else None
            if after is not None:
                return self.execute_complete(context, after, _inline=_inline + 1)
            self._defer(seen, carry)
            return None
        if ev.type == watch.ERROR:
            if ev.retryable:
                raise RuntimeError(f"monitor of run {seen.run} could not look: {ev.message} (retrying)")
            raise AirflowFailException(f"monitor of run {seen.run} failed: {ev.message}")
        if ev.type == watch.STALE:
            raise AirflowFailException(f"{ev.message}; runbook: {runbook_path('stale_heartbeat')}")
        if ev.type == watch.LAUNCH_HELD:
            raise AirflowFailException(f"{ev.message}; runbook: {runbook_path('launch_held')}")
        if ev.type == watch.NO_RECORDS:
            if ev.outcome is not None:  # the job has ended (else it still runs, without records)
                self._job_ended(seen.run)
            self._emit_asset_events(context, seen.run, carry.promoted)
            raise AirflowFailException(str(ev.message))
        if ev.type == watch.ALERT:
            return self._on_alert(context, event, ev, seen, carry)
        if ev.type == watch.JOB_DONE:
            return self._on_job_done(context, ev, seen, carry)
        raise AirflowFailException(f"unknown monitor event type {ev.type!r}")

    def _on_alert(
        self, context: Any, event: Any, ev: MonitorEvent, seen: watch.Seen, carry: Carry
    ) -> dict[str, Any] | None:
        """An alert: hand it over to sdc_incident (the task's result), or, when it is not authentic, defer
        again past it (None)."""
        assert ev.alert is not None  # MonitorEvent refuses an alert event without one
        if not self._authentic(seen, ev):
            self._defer(watch.handled(seen, event), carry)  # keep watching the real job
            return None
        a = Alert.from_json(ev.alert)
        # Checkpoints from before the alert's step that are not gated yet are left to sdc_incident
        # (its freeze gates them beside the attribution and the drain, its pick gates any it missed):
        # validating one here (torch, a download, a load) held the hand-over back by seconds.
        self._emit_asset_events(context, seen.run, carry.promoted)
        self.log.error(
            "SDC ALERT in run %s: %s at step %s, suspect nodes %s; handing over to sdc_incident (runbook: %s)",
            seen.run,
            a.check,
            a.step,
            list(a.suspect_nodes),
            runbook_path(a.check),
        )
        return {
            "outcome": ALERTED,
            "run": seen.run,
            "job_id": seen.job_id,
            "alert_key": ev.alert_key,
            "alert": ev.alert,
            "seen_at": ev.at,
            "promoted": list(carry.promoted),
            "rejected": list(carry.rejected),
        }

    def _on_job_done(self, context: Any, ev: MonitorEvent, seen: watch.Seen, carry: Carry) -> dict[str, Any]:
        """The job ended without an alert: the task's result when it succeeded, else the task fails."""
        self._job_ended(seen.run)
        self._emit_asset_events(context, seen.run, carry.promoted)
        if ev.outcome != "success":
            raise AirflowFailException(
                f"run {seen.run}: Slurm job ended {ev.message}"
                + (" without an alert record in the store" if ev.label == "sdc_verdict" else "")
            )
        self.log.info("run %s: job %s completed", seen.run, seen.job_id)
        return {
            "outcome": COMPLETED,
            "run": seen.run,
            "job_id": seen.job_id,
            "state": ev.state,
            "promoted": list(carry.promoted),
            "rejected": list(carry.rejected),
        }

    def _job_ended(self, run: str) -> None:
        """The watched job ended without an alert, so the run has ended: its store identity goes
        (longrun.run_identity; nothing with the shared job identity). A store that cannot remove it now
        fails this try, and the retry, which sees the same end, removes it."""
        try:
            if identities_from_env().revoke(run):
                self.log.info("run %s ended: its store identity is removed", run)
        except RunIdentityError as e:
            raise RuntimeError(
                f"run {run} ended but its store identity is still there: {e} (retrying)"
            ) from e

    def _authentic(self, seen: watch.Seen, event: MonitorEvent) -> bool:
        """Hand over only an alert signed by this job's key, about this run and job, naming nodes of its
        allocation; anything else is a security event and the watch goes on."""
        verdict = alert_auth.verify_alert(
            self.store, self.hook.client, run=seen.run, job_id=seen.job_id, alert=event.alert or {}
        )
        if not verdict.ok:
            details = {**verdict.details, "alert_key": event.alert_key, "by": "training_run.monitor"}
            security_events.raise_event(self.store, run=seen.run, reason=verdict.reason, details=details)
        return verdict.ok

    def _emit_asset_events(self, context: Any, run: str, promoted: Sequence[Mapping[str, Any]]) -> None:
        """One asset event per checkpoint this DAG run promoted, read back from the store's promotion
        history (so a retried try still reports what earlier tries promoted)."""
        by = _promoter(context)
        # An entry that does not read is left out: these events report, they decide nothing.
        history = [r for r in catalog.promotion_history(self.store, run, problems=[]) if r.by == by]
        if not history:
            return
        manifests = catalog.checkpoints(self.store, run).by_step()
        asset = checkpoint_asset(self.store, run)
        events = context["outlet_events"][CHECKPOINTS_ALIAS]
        for r in history:  # by seq
            m = manifests.get(r.step)
            extra = {
                "run": run,
                "step": r.step,
                "manifest_key": r.manifest_key,
                "seq": r.seq,
                "promoted_at": r.time,
                "loss": m.manifest.loss if m else None,
                "saved_at": m.manifest.time if m else None,
            }
            events.add(asset, extra=extra)
        self.log.info(
            "asset events for %d promoted checkpoint(s) of %s: %s",
            len(history),
            asset.uri,
            [r.step for r in history],
        )


def _promoter(context: Any) -> str:
    """The `by` of promotions made by this DAG run's monitor."""
    return f"training_run.monitor:{context['run_id']}"
