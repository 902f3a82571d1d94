"""The one client for Airflow 3's REST API (`/api/v2`): the drill, `make demo`, the benches and the tests.

Only what a user of the API does: log in, trigger, read runs and task instances, set a Variable,
approve a human-in-the-loop task. Every wait is bounded and polls; a refusal or a timeout raises
`AirflowApiError` with the last state seen.

    api = AirflowRest.login(url, user, password)
    api.wait_dag_parsed("training_run")
    run_id = api.trigger("training_run", conf={"run_name": "demo"})
    assert api.wait_run("training_run", run_id) == "success"
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from longrun.runbooks import runbook_url

TERMINAL_RUN_STATES = frozenset({"success", "failed"})
#: Worth another poll: the API was slow or briefly unreachable (a GET is safe to repeat).
TRANSIENT_ERRORS = (requests.Timeout, requests.ConnectionError)


class AirflowApiError(RuntimeError):
    """The API refused a call, or a bounded wait ran out."""


@dataclass(slots=True, kw_only=True)
class AirflowRest:
    """An authenticated session against one Airflow API server."""

    url: str
    """Base URL without a trailing slash, e.g. http://127.0.0.1:22080."""
    token: str
    """JWT from POST /auth/token."""
    timeout: float = 30.0
    """Seconds per HTTP request (on 2 busy cores, SQLite locks can stall the API for seconds)."""
    session: requests.Session = field(default_factory=requests.Session)
    """Keeps the connection open between calls."""

    def __post_init__(self) -> None:
        if not self.url.startswith("http") or self.url.endswith("/"):
            raise ValueError(f"url must be http(s) without a trailing slash, got {self.url!r}")
        if not self.token:
            raise ValueError("token must not be empty")
        self.session.headers["Authorization"] = f"Bearer {self.token}"

    @classmethod
    def login(cls, url: str, user: str, password: str, *, timeout: float = 30.0) -> AirflowRest:
        """Get a token with the user's password."""
        url = url.rstrip("/")
        resp = requests.post(
            f"{url}/auth/token", json={"username": user, "password": password}, timeout=timeout
        )
        if resp.status_code not in (200, 201):
            raise AirflowApiError(f"Airflow login at {url}: HTTP {resp.status_code}: {resp.text[:300]}")
        return cls(url=url, token=resp.json()["access_token"], timeout=timeout)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AirflowRest:
        """Log in with `longrun stack env`'s LONGRUN_AIRFLOW_URL, _USER and _PASSWORD."""
        return cls.login(
            env["LONGRUN_AIRFLOW_URL"], env["LONGRUN_AIRFLOW_USER"], env["LONGRUN_AIRFLOW_PASSWORD"]
        )

    # --- plumbing ------------------------------------------------------------------------------
    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One call under /api/v2; raises AirflowApiError on a 4xx/5xx answer."""
        resp = self.session.request(method, f"{self.url}/api/v2{path}", timeout=self.timeout, **kwargs)
        if resp.status_code >= 400:
            raise AirflowApiError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:500]}")
        return resp

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """`request`, returning the decoded JSON body (None for an empty one)."""
        resp = self.request(method, path, **kwargs)
        return resp.json() if resp.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None).json()

    def _get_or_none(self, path: str) -> Any:
        """GET, or None on 404 (a DAG not parsed yet, a run not created yet)."""
        resp = self.session.get(f"{self.url}/api/v2{path}", timeout=self.timeout)
        if resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            raise AirflowApiError(f"GET {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    # --- DAGs --------------------------------------------------------------------------------
    def dag(self, dag_id: str) -> dict[str, Any] | None:
        """The DAG's record, or None while the dag-processor has not parsed it yet."""
        found = self._get_or_none(f"/dags/{dag_id}")
        return dict(found) if found is not None else None

    def import_errors(self) -> list[dict[str, Any]]:
        return list(self.get("/importErrors").get("import_errors", []))

    def wait_dag_parsed(
        self, dag_id: str, *, timeout: float = 90.0, file_hint: str | None = None
    ) -> dict[str, Any]:
        """Wait until the DAG is known; fail early if its file (`file_hint`, a substring) has an import error."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if (found := self.dag(dag_id)) is not None:
                    return found
                hint = file_hint or dag_id
                errors = [e for e in self.import_errors() if hint in str(e.get("filename", ""))]
            except TRANSIENT_ERRORS:
                errors = []
            if errors:
                raise AirflowApiError(
                    f"DAG {dag_id}: import error in {errors[0].get('filename')}: {errors[0].get('stack_trace')}"
                )
            if time.monotonic() > deadline:
                raise AirflowApiError(f"DAG {dag_id} not parsed after {timeout:.0f} s")
            time.sleep(1.0)

    def dag_ready(self, dag_id: str, *, timeout: float = 180.0) -> None:
        """Parsed and not paused. A paused DAG was paused by someone: say so, do not undo it."""
        if self.wait_dag_parsed(dag_id, timeout=timeout).get("is_paused"):
            raise AirflowApiError(
                f"DAG {dag_id} is paused: unpause it (`airflow dags unpause {dag_id}` or the UI toggle); "
                f"runbook {runbook_url('dag_paused')}"
            )

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def pause(self, dag_id: str) -> None:
        self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": True})

    def set_variable(self, key: str, value: str) -> None:
        """Create or replace an Airflow Variable."""
        resp = self.session.patch(
            f"{self.url}/api/v2/variables/{key}", json={"key": key, "value": value}, timeout=self.timeout
        )
        if resp.status_code == 404:
            self.request("POST", "/variables", json={"key": key, "value": value})
        elif resp.status_code >= 400:
            raise AirflowApiError(f"PATCH /variables/{key}: HTTP {resp.status_code}: {resp.text[:300]}")

    # --- runs --------------------------------------------------------------------------------
    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None, run_id: str | None = None) -> str:
        """Start a run now with `conf` as its params; returns the run id."""
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf or {})}
        if run_id:
            body["dag_run_id"] = run_id
        return str(self.request("POST", f"/dags/{dag_id}/dagRuns", json=body).json()["dag_run_id"])

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.get(f"/dags/{dag_id}/dagRuns/{run_id}"))

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        """The run's state, or None while it does not exist (a hand-over not triggered yet)."""
        found = self._get_or_none(f"/dags/{dag_id}/dagRuns/{run_id}")
        return str(found["state"]) if found is not None else None

    def wait_run(self, dag_id: str, run_id: str, *, timeout: float = 120.0, interval: float = 1.0) -> str:
        """Poll until the run is success or failed; returns that state."""
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            try:
                state = str(self.run(dag_id, run_id)["state"])
            except TRANSIENT_ERRORS:
                continue  # a slow answer is not an answer; the deadline still bounds the wait
            if state in TERMINAL_RUN_STATES:
                return state
            time.sleep(interval)
        summary = {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}
        raise AirflowApiError(f"run {dag_id}/{run_id} still {state} after {timeout:.0f} s; tasks: {summary}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return list(self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").get("task_instances", []))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """task_id -> state (mapped tasks: the last map index wins)."""
        return {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def clear_tasks(
        self, dag_id: str, run_id: str, task_ids: list[str], *, downstream: bool = True
    ) -> list[str]:
        """Clear these tasks of one run (and by default their downstream tasks), whatever their state, as
        the UI's Clear does; the run goes back to running. Returns the task ids Airflow cleared."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": list(task_ids),
            "include_downstream": downstream,
            "only_failed": False,
            "reset_dag_runs": True,
        }
        found = self.call("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)
        return [str(ti.get("task_id")) for ti in (found or {}).get("task_instances", [])]

    def approve(self, dag_id: str, run_id: str, task_id: str) -> bool:
        """Answer a human-in-the-loop task with "Approve"; False if the API refused (not waiting yet)."""
        return self.answer(dag_id, run_id, task_id, "Approve")

    def answer(self, dag_id: str, run_id: str, task_id: str, option: str) -> bool:
        """Answer a human-in-the-loop task with one of its options (an ApprovalOperator's are "Approve"
        and "Reject"); False if the API refused (not waiting yet)."""
        resp = self.session.patch(
            f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails",
            json={"chosen_options": [option]},
            timeout=self.timeout,
        )
        return resp.status_code < 400

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, *, try_number: int | None = None, map_index: int = -1
    ) -> str:
        """The task try's log as text (one line per structured log event); by default its latest try.

        The latest try is the one the task instance row holds; asking for try 1 of a finished approval task
        once answered 404 "TaskInstance not found" in CI, so the default does not guess a number."""
        if try_number is None:
            path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
            ti = self.get(path if map_index < 0 else f"{path}/{map_index}")
            try_number = max(1, int(ti.get("try_number") or 1))
        data = self.get(
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            full_content="true",
            map_index=map_index,
        )
        content = data.get("content", "")
        if isinstance(content, str):
            return content
        lines = []
        for item in content:
            if isinstance(item, dict):
                extra = {k: v for k, v in item.items() if k not in ("event", "timestamp", "level", "logger")}
                line = str(item.get("event", ""))
                lines.append(f"{line} {extra}" if extra and not item.get("sources") else line)
            else:
                lines.append(str(item))
        return "\n".join(lines)
