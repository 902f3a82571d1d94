"""A drill through the real stack: trigger `training_run` over REST, follow it through `sdc_incident` and
the relaunched run, and read back what happened (shared by the e2e test, `make demo` and the bench).

Only public surfaces are used: Airflow's REST API (as a user would), the Slurm client, and the store's
records (incident record, reports). Every wait is bounded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from longrun.airflow_rest import TRANSIENT_ERRORS, AirflowRest
from longrun.dagrun_ids import attempt_run_id, incident_run_id
from longrun.health.ratelimit import DRAIN_POLICY_VARIABLE
from longrun.runview import RunView
from longrun.slurm.client import SlurmClient
from training.records import schema
from training.records.orchestrator import Incident, IncidentStatus
from training.store.interface import ObjectStore

Say = Callable[[str], None]


class DrillError(RuntimeError):
    """The drill did not go as the story says; the message says where it stopped."""


# The name the demo, the benches and the e2e test use for the package's one REST client.
Rest = AirflowRest

#: The drill's run, everything but its name and its fault: 3 CPU nodes, 40 steps of the tiny model, every
#: check often enough that each drill kind is caught within a few steps (the demo and the e2e test).
DRILL_CONF: Mapping[str, Any] = {
    "nodes": 3,
    "gpus_per_node": 0,
    "steps": 40,
    "checkpoint_every": 10,
    "recompute_every": 5,
    "vote_every": 5,
}


@dataclass(slots=True, kw_only=True)
class DrillResult:
    """What a drill (or a clean run) produced."""

    run: str
    """Run name."""
    kind: str | None
    """Drill kind, None for a clean run."""
    dag_runs: list[tuple[str, str, str]] = field(default_factory=list)
    """(dag id, run id, final state) in the order they ran."""
    final_fingerprint: str | None = None
    """The trainer's report `final_fingerprint` of the last attempt."""
    final_step: int | None = None
    """The report's final step."""
    incident: Incident | None = None
    """The incident record, when there was one."""
    promoted_steps: list[int] = field(default_factory=list)
    """Checkpoint steps ever promoted in the run (the finish report's orchestrator block)."""
    segments: list[dict[str, Any]] = field(default_factory=list)
    """Every incarnation of the trainer, in order (the finish report's `segments`): the proof of resume."""
    wall_s: float = 0.0
    """Trigger to the end of the last DAG run."""

    @property
    def detection_step(self) -> int | None:
        return int(self.incident.alert["step"]) if self.incident else None

    @property
    def lost_steps(self) -> int | None:
        return self.incident.lost_steps if self.incident else None

    @property
    def recover_s(self) -> float | None:
        return self.incident.time_to_recover_s if self.incident else None

    @property
    def recovery(self) -> dict[str, Any]:
        """The incident's recovery measured from the records (longrun.incident.recovery), {} if none."""
        return self.incident.recovery.to_json() if self.incident else {}

    @property
    def to_training_s(self) -> float | None:
        """Alert written -> first healthy step of the relaunch: the headline time to recover."""
        return self.incident.recovery.alert_to_first_healthy_step_s if self.incident else None

    def breakdown(self) -> dict[str, float]:
        """Seconds from the alert record's time to each incident timeline event."""
        if not self.incident:
            return {}
        t_alert = float(self.incident.alert["time"])
        return {e.event: round(e.time - t_alert, 2) for e in self.incident.timeline if e.time is not None}

    def summary(self) -> str:
        lines = [
            f"run {self.run} ({self.kind or 'clean'}): final step {self.final_step}, fingerprint {self.final_fingerprint}"
        ]
        if self.incident:
            inc = self.incident
            lines += [
                f"  alert: {inc.alert['check']} at step {self.detection_step} naming {inc.alert['suspect_nodes']}",
                f"  diagnosis: {inc.diagnosis.summary}",
                f"  resumed from step {inc.checkpoint.step}; lost steps {self.lost_steps}",
                f"  alert -> relaunched RUNNING: {self.recover_s} s; relaunch on {list(inc.relaunch.nodes or ())}",
                f"  alert -> first healthy step: {self.to_training_s} s; recovery {self.recovery.get('milestones_s')}",
                f"  timeline (s after the alert): {self.breakdown()}",
            ]
        for dag_id, run_id, state in self.dag_runs:
            lines.append(f"  {dag_id} {run_id}: {state}")
        return "\n".join(lines)


def prepare(rest: Rest, *, max_drains: int = 100, window_s: float = 3600.0) -> None:
    """DAGs parsed (and not paused by anyone); a drain policy roomy enough for repeated drills."""
    for dag_id in ("training_run", "sdc_incident"):
        rest.dag_ready(dag_id)
    rest.set_variable(DRAIN_POLICY_VARIABLE, json.dumps({"max_drains": max_drains, "window_s": window_s}))


def return_to_service(client: SlurmClient, say: Say = print) -> list[str]:
    """Resume every node longrun drained (a drill's last step: the runbook's return-to-service)."""
    back = []
    for n in client.nodes():
        if n.drain_flag and n.reason and n.reason.startswith(schema.DRAIN_PREFIX):
            client.resume(n.name)
            back.append(n.name)
            say(f"returned {n.name} to service (was: {n.reason})")
    return back


APPROVAL_TASKS = ("approve_drain", "approve_relaunch")


def _follow(
    rest: Rest,
    dag_id: str,
    run_id: str,
    *,
    deadline: float,
    say: Say,
    progress: Callable[[], str] | None,
    approve: bool = False,
    reject: Collection[str] = (),
) -> str:
    last: Any = None
    t0 = time.monotonic()
    approved: set[tuple[str, int]] = set()
    while time.monotonic() < deadline:
        try:
            state = rest.run_state(dag_id, run_id)
            if state is None:
                time.sleep(1.0)
                continue
            states = rest.task_states(dag_id, run_id)
            if approve:
                _approve_waiting(rest, dag_id, run_id, approved, say, reject=reject)
        except TRANSIENT_ERRORS as exc:
            # A slow or restarting API server is not the run's outcome: poll again, within the deadline.
            # (An approval that timed out but landed is not asked again: its task is no longer waiting.)
            say(
                f"  [{time.monotonic() - t0:6.1f}s] {dag_id}: the Airflow API did not answer ({type(exc).__name__}); polling again"
            )
            time.sleep(2.0)
            continue
        active = sorted(
            t for t, s in states.items() if s in ("running", "deferred", "queued", "awaiting_input")
        )
        extra = progress() if progress else ""
        line = (state, tuple(active), extra)
        if line != last:
            say(
                f"  [{time.monotonic() - t0:6.1f}s] {dag_id}: {state}; active {', '.join(active) or '-'} {extra}"
            )
            last = line
        if state in ("success", "failed"):
            return state
        time.sleep(2.0)
    raise DrillError(f"{dag_id} run {run_id} did not finish in time (last: {last})")


def _approve_waiting(
    rest: Rest,
    dag_id: str,
    run_id: str,
    approved: set[tuple[str, int]],
    say: Say,
    *,
    reject: Collection[str] = (),
) -> None:
    """Answer each approval task's try once: "Reject" for the tasks in `reject`, else "Approve". Keyed by
    try: when Airflow's deferral race fails a resumed approval, its retry asks again, and a person
    answering the UI would answer again too."""
    for ti in rest.task_instances(dag_id, run_id):
        key = (str(ti.get("task_id")), int(ti.get("try_number") or 0))
        if (
            key[0] in APPROVAL_TASKS
            and ti.get("state") in ("awaiting_input", "deferred")
            and key not in approved
        ):
            option = "Reject" if key[0] in reject else "Approve"
            if rest.answer(dag_id, run_id, key[0], option):
                approved.add(key)
                say(f"  a person answers {option} to {key[0]} try {key[1]} (human-in-the-loop)")


def _progress(store: ObjectStore, run: str) -> Callable[[], str]:
    def look() -> str:
        p = RunView(store, run).progress  # a fresh view: each look reads the newest heartbeat
        if p is None:
            return ""
        return f"(step {p.step}, loss {p.loss:.4f})" if p.loss is not None else f"(step {p.step})"

    return look


def _incident(store: ObjectStore, run: str) -> Incident | None:
    """The run's first incident (a drill has one), read afresh."""
    incidents = RunView(store, run).incidents
    return incidents[0][1] if incidents else None


def run_drill(
    rest: Rest,
    store: ObjectStore,
    conf: Mapping[str, Any],
    *,
    say: Say = print,
    timeout_s: float = 1800.0,
    approve: bool = False,
    reject: Collection[str] = (),
    operator: Callable[[str, str], bool] | None = None,
) -> DrillResult:
    """Trigger training_run with `conf` and follow it (and its incident and relaunch) to the end.

    With `approve`, a person answers the incident's approval tasks: "Approve", or "Reject" for those named
    in `reject`. `operator(dag_id, run_id)`, when given, is a person called when a followed run ends failed: it
    returns True after following a runbook that clears the failed tasks (the run is followed again), and
    False to let the failure stand. It is asked again after each repair, so it must know when to stop."""
    run = str(conf["run_name"])
    drill = conf.get("drill")
    result = DrillResult(run=run, kind=drill["kind"] if drill else None)
    deadline = time.monotonic() + timeout_s
    t0 = time.monotonic()
    run_id = rest.trigger("training_run", conf)
    say(f"triggered training_run {run_id} for run {run} (drill: {drill})")

    def follow(dag_id: str, run_id: str, **kw: Any) -> str:
        state = _follow(rest, dag_id, run_id, deadline=deadline, say=say, **kw)
        while state == "failed" and operator is not None and operator(dag_id, run_id):
            say(f"  an operator repaired {dag_id} {run_id} by its runbook; following it again")
            state = _follow(rest, dag_id, run_id, deadline=deadline, say=say, **kw)
        return state

    state = follow("training_run", run_id, progress=_progress(store, run))
    result.dag_runs.append(("training_run", run_id, state))
    if state != "success":
        raise DrillError(f"training_run {run_id} ended {state}: {result.summary()}")
    alerts = [key for key, _alert in RunView(store, run).alerts]
    if alerts:
        incident_run = incident_run_id(alerts[0])
        say(f"alert {alerts[0]} -> sdc_incident {incident_run}")
        state = follow("sdc_incident", incident_run, progress=None, approve=approve, reject=reject)
        result.dag_runs.append(("sdc_incident", incident_run, state))
        result.incident = _incident(store, run)
        if state != "success":
            raise DrillError(f"sdc_incident {incident_run} ended {state}: {result.summary()}")
        if result.incident and result.incident.status == IncidentStatus.OBSERVED:
            say("observe mode: nothing was changed and nothing relaunched")
            result.wall_s = round(time.monotonic() - t0, 1)
            return result
        attempt_run = attempt_run_id(run, 1)
        say(f"relaunched job -> training_run {attempt_run}")
        state = follow("training_run", attempt_run, progress=_progress(store, run))
        result.dag_runs.append(("training_run", attempt_run, state))
        if state != "success":
            raise DrillError(f"training_run {attempt_run} ended {state}: {result.summary()}")
    _fill_from_report(store, run, result)
    result.wall_s = round(time.monotonic() - t0, 1)
    return result


def _fill_from_report(store: ObjectStore, run: str, result: DrillResult) -> None:
    """Fill `result` from the run's report (final fingerprint and step, promoted steps, segments), and
    read the incident record again: the relaunch's finish added the recovery to it."""
    view = RunView(store, run)
    report = view.report
    if report is None:
        raise DrillError(f"run {run} has no readable run report: {view.problems}")
    result.final_fingerprint = report.final_fingerprint
    result.final_step = report.final_step
    result.promoted_steps = list(report.orchestrator.promoted_steps)
    result.segments = list(report.orchestrator.segments)
    if result.incident:  # the relaunch's finish added the recovery to the incident record
        result.incident = _incident(store, run)
