"""A small client for Airflow 3's REST API, for tests that go through a real scheduler and triggerer.

Every wait is bounded and polls; a timeout raises `AirflowApiError` with the last state seen.

    api = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
    api.wait_dag_parsed("smoke")
    api.unpause("smoke")
    run_id = api.trigger("smoke", conf={"x": 1})
    assert api.wait_run("smoke", run_id) == "success"
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import requests

TERMINAL_RUN_STATES = frozenset({"success", "failed"})
# Worth another poll: the API was slow or briefly unreachable.
_TRANSIENT = (requests.Timeout, requests.ConnectionError)


class AirflowApiError(RuntimeError):
    """The API refused a call, or a bounded wait ran out."""


@dataclass(slots=True, kw_only=True)
class AirflowApi:
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
    def login(cls, url: str, user: str, password: str, *, timeout: float = 30.0) -> AirflowApi:
        """Get a token with the user's password."""
        url = url.rstrip("/")
        resp = requests.post(
            f"{url}/auth/token", json={"username": user, "password": password}, timeout=timeout
        )
        if resp.status_code not in (200, 201):
            raise AirflowApiError(f"POST /auth/token: HTTP {resp.status_code}: {resp.text[:300]}")
        return cls(url=url, token=resp.json()["access_token"], timeout=timeout)

    # --- plumbing ------------------------------------------------------------------------------
    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One call under /api/v2; raises AirflowApiError on a 4xx/5xx answer."""
        resp = self.session.request(method, f"{self.url}/api/v2{path}", timeout=self.timeout, **kwargs)
        if resp.status_code >= 400:
            raise AirflowApiError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:500]}")
        return resp

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None).json()

    # --- DAGs --------------------------------------------------------------------------------
    def dag(self, dag_id: str) -> dict[str, Any] | None:
        """The DAG's record, or None while the dag-processor has not parsed it yet."""
        resp = self.session.get(f"{self.url}/api/v2/dags/{dag_id}", timeout=self.timeout)
        if resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            raise AirflowApiError(f"GET /dags/{dag_id}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    def import_errors(self) -> list[dict[str, Any]]:
        return self.get("/importErrors").get("import_errors", [])

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
            except _TRANSIENT:
                errors = []
            if errors:
                raise AirflowApiError(
                    f"DAG {dag_id}: import error in {errors[0].get('filename')}: {errors[0].get('stack_trace')}"
                )
            if time.monotonic() > deadline:
                raise AirflowApiError(f"DAG {dag_id} not parsed after {timeout:.0f} s")
            time.sleep(1.0)

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def pause(self, dag_id: str) -> None:
        self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": True})

    # --- runs --------------------------------------------------------------------------------
    def trigger(self, dag_id: str, *, conf: dict[str, Any] | None = None, run_id: str | None = None) -> str:
        """Start a run now with `conf` as its params; returns the run id."""
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        return str(self.request("POST", f"/dags/{dag_id}/dagRuns", json=body).json()["dag_run_id"])

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}")

    def wait_run(self, dag_id: str, run_id: str, *, timeout: float = 120.0, interval: float = 1.0) -> str:
        """Poll until the run is success or failed; returns that state."""
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            try:
                state = str(self.run(dag_id, run_id)["state"])
            except _TRANSIENT:
                continue  # a slow answer is not an answer; the deadline still bounds the wait
            if state in TERMINAL_RUN_STATES:
                return state
            time.sleep(interval)
        summary = {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}
        raise AirflowApiError(f"run {dag_id}/{run_id} still {state} after {timeout:.0f} s; tasks: {summary}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").get("task_instances", [])

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """task_id -> state (mapped tasks: the last map index wins)."""
        return {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, *, try_number: int = 1, map_index: int = -1
    ) -> str:
        """The task try's log as text (one line per structured log event)."""
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
