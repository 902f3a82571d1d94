"""A drill through the real stack: trigger `training_run` over REST, follow it through `sdc_incident` and
the relaunched run, and read back what happened (shared by the e2e test, `make demo` and the bench).

Only public surfaces are used: Airflow's REST API (as a user would), the Slurm client, and the store's
records (incident record, reports). Every wait is bounded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from longrun.incident.ratelimit import DRAIN_POLICY_VARIABLE
from longrun.runbooks import runbook_url
from longrun.slurm.client import SlurmClient
from longrun.slurm.validate import DRAIN_PREFIX
from training import schema
from training.store import NotFound, ObjectStore, get_json

Say = Callable[[str], None]


class DrillError(RuntimeError):
    """The drill did not go as the story says; the message says where it stopped."""


@dataclass(slots=True, kw_only=True)
class Rest:
    """Just enough of Airflow 3's REST API for a drill."""

    url: str
    """Base URL, e.g. http://127.0.0.1:21730."""
    token: str
    """JWT from /auth/token."""
    timeout: float = 15.0
    """Seconds per request."""
    session: requests.Session = field(default_factory=requests.Session)
    """Kept open between calls."""

    @classmethod
    def login(cls, url: str, user: str, password: str) -> Rest:
        url = url.rstrip("/")
        r = requests.post(f"{url}/auth/token", json={"username": user, "password": password}, timeout=15)
        if r.status_code not in (200, 201):
            raise DrillError(f"Airflow login at {url} failed: HTTP {r.status_code} {r.text[:200]}")
        rest = cls(url=url, token=r.json()["access_token"])
        rest.session.headers["Authorization"] = f"Bearer {rest.token}"
        return rest

    def call(self, method: str, path: str, **kw: Any) -> Any:
        r = self.session.request(method, f"{self.url}/api/v2{path}", timeout=self.timeout, **kw)
        if r.status_code >= 400:
            raise DrillError(f"{method} {path}: HTTP {r.status_code}: {r.text[:400]}")
        return r.json() if r.content else None

    def dag_ready(self, dag_id: str, *, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            r = self.session.get(f"{self.url}/api/v2/dags/{dag_id}", timeout=self.timeout)
            if r.status_code == 200:
                if r.json().get("is_paused"):
                    # Our DAGs are created unpaused; a paused one was paused by someone: say so, do not undo it.
                    raise DrillError(
                        f"DAG {dag_id} is paused: unpause it (`airflow dags unpause {dag_id}` or the UI toggle); "
                        f"runbook {runbook_url('dag_paused')}"
                    )
                return
            if time.monotonic() > deadline:
                errors = self.call("GET", "/importErrors").get("import_errors", [])
                raise DrillError(f"DAG {dag_id} not parsed after {timeout_s:.0f} s; import errors: {errors}")
            time.sleep(1.0)

    def set_variable(self, key: str, value: str) -> None:
        r = self.session.patch(
            f"{self.url}/api/v2/variables/{key}", json={"key": key, "value": value}, timeout=self.timeout
        )
        if r.status_code == 404:
            self.call("POST", "/variables", json={"key": key, "value": value})
        elif r.status_code >= 400:
            raise DrillError(f"PATCH /variables/{key}: HTTP {r.status_code}: {r.text[:300]}")

    def trigger(self, dag_id: str, conf: Mapping[str, Any], run_id: str | None = None) -> str:
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf)}
        if run_id:
            body["dag_run_id"] = run_id
        return str(self.call("POST", f"/dags/{dag_id}/dagRuns", json=body)["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        r = self.session.get(f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{run_id}", timeout=self.timeout)
        if r.status_code == 404:
            return None
        if r.status_code >= 400:
            raise DrillError(f"GET run {dag_id}/{run_id}: HTTP {r.status_code}")
        return str(r.json()["state"])

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").get("task_instances", [])
        return {t["task_id"]: t["state"] for t in tis}


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
    incident: dict[str, Any] | None = None
    """The incident record, when there was one."""
    promoted_steps: list[int] = field(default_factory=list)
    """Checkpoint steps ever promoted in the run (the finish report's orchestrator block)."""
    wall_s: float = 0.0
    """Trigger to the end of the last DAG run."""

    @property
    def detection_step(self) -> int | None:
        return int(self.incident["alert"]["step"]) if self.incident else None

    @property
    def lost_steps(self) -> int | None:
        return self.incident.get("lost_steps") if self.incident else None

    @property
    def recover_s(self) -> float | None:
        return self.incident.get("time_to_recover_s") if self.incident else None

    def breakdown(self) -> dict[str, float]:
        """Seconds from the alert record's time to each incident timeline event."""
        if not self.incident:
            return {}
        t_alert = float(self.incident["alert"]["time"])
        return {e["event"]: round(float(e["time"]) - t_alert, 2) for e in self.incident["timeline"]}

    def summary(self) -> str:
        lines = [
            f"run {self.run} ({self.kind or 'clean'}): final step {self.final_step}, fingerprint {self.final_fingerprint}"
        ]
        if self.incident:
            inc = self.incident
            lines += [
                f"  alert: {inc['alert']['check']} at step {self.detection_step} naming {inc['alert']['suspect_nodes']}",
                f"  diagnosis: {(inc.get('diagnosis') or {}).get('summary')}",
                f"  resumed from step {(inc.get('checkpoint') or {}).get('step')}; lost steps {self.lost_steps}",
                f"  alert -> relaunched RUNNING: {self.recover_s} s; relaunch on {(inc.get('relaunch') or {}).get('nodes')}",
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
        if n.drain_flag and n.reason and n.reason.startswith(DRAIN_PREFIX):
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
) -> str:
    last: Any = None
    t0 = time.monotonic()
    approved: set[str] = set()
    while time.monotonic() < deadline:
        state = rest.run_state(dag_id, run_id)
        if state is None:
            time.sleep(1.0)
            continue
        states = rest.task_states(dag_id, run_id)
        if approve:
            for task_id in APPROVAL_TASKS:
                if states.get(task_id) in ("awaiting_input", "deferred") and task_id not in approved:
                    r = rest.session.patch(
                        f"{rest.url}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails",
                        json={"chosen_options": ["Approve"]},
                        timeout=rest.timeout,
                    )
                    if r.status_code < 400:
                        approved.add(task_id)
                        say(f"  a person approves {task_id} (human-in-the-loop)")
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


def _progress(store: ObjectStore, run: str) -> Callable[[], str]:
    def look() -> str:
        try:
            p = get_json(store, schema.store_key(run, schema.PROGRESS_PATH))
        except (NotFound, ValueError):
            return ""
        return (
            f"(step {p.get('step')}, loss {p.get('loss'):.4f})"
            if isinstance(p.get("loss"), float)
            else f"(step {p.get('step')})"
        )

    return look


def run_drill(
    rest: Rest,
    store: ObjectStore,
    conf: Mapping[str, Any],
    *,
    say: Say = print,
    timeout_s: float = 1800.0,
    approve: bool = False,
) -> DrillResult:
    """Trigger training_run with `conf` and follow it (and its incident and relaunch) to the end."""
    run = str(conf["run_name"])
    drill = conf.get("drill")
    result = DrillResult(run=run, kind=drill["kind"] if drill else None)
    deadline = time.monotonic() + timeout_s
    t0 = time.monotonic()
    run_id = rest.trigger("training_run", conf)
    say(f"triggered training_run {run_id} for run {run} (drill: {drill})")
    state = _follow(rest, "training_run", run_id, deadline=deadline, say=say, progress=_progress(store, run))
    result.dag_runs.append(("training_run", run_id, state))
    if state != "success":
        raise DrillError(f"training_run {run_id} ended {state}: {result.summary()}")
    alerts = [o.key for o in store.list(schema.store_key(run, "alerts/"))]
    if alerts:
        incident_run = f"incident__{alerts[0].rsplit('/', 1)[1][: -len('.json')]}"
        say(f"alert {alerts[0]} -> sdc_incident {incident_run}")
        state = _follow(
            rest, "sdc_incident", incident_run, deadline=deadline, say=say, progress=None, approve=approve
        )
        result.dag_runs.append(("sdc_incident", incident_run, state))
        incidents = [
            o.key for o in store.list(schema.store_key(run, "incidents/")) if o.key.endswith(".json")
        ]
        if incidents:
            result.incident = get_json(store, incidents[0])
        if state != "success":
            raise DrillError(f"sdc_incident {incident_run} ended {state}: {result.summary()}")
        if result.incident and result.incident.get("status") == "observed":
            say("observe mode: nothing was changed and nothing relaunched")
            result.wall_s = round(time.monotonic() - t0, 1)
            return result
        attempt_run = f"{run}__attempt1"
        say(f"relaunched job -> training_run {attempt_run}")
        state = _follow(
            rest, "training_run", attempt_run, deadline=deadline, say=say, progress=_progress(store, run)
        )
        result.dag_runs.append(("training_run", attempt_run, state))
        if state != "success":
            raise DrillError(f"training_run {attempt_run} ended {state}: {result.summary()}")
    report = get_json(store, schema.store_key(run, schema.REPORT_PATH))
    result.final_fingerprint = report.get("final_fingerprint")
    result.final_step = report.get("final_step")
    result.promoted_steps = list((report.get("orchestrator") or {}).get("promoted_steps") or [])
    result.wall_s = round(time.monotonic() - t0, 1)
    return result
