"""The drill's follower outlives a slow Airflow API: a read timeout is polled again, not the run's end.

A scripted stand-in for the API client (no Airflow is needed to show how `_follow` treats an answer
that never comes); the real client raises the same `requests` errors.
"""

from __future__ import annotations

import time

import pytest
import requests
from longrun import drill
from longrun.airflow_rest import AirflowApiError


class ScriptedApi:
    """Answers `run_state` from a script; an exception in the script is raised instead of answered."""

    def __init__(self, script: list[object]) -> None:
        self.script = list(script)
        self.calls = 0

    def run_state(self, dag_id: str, run_id: str) -> object:
        self.calls += 1
        item = self.script.pop(0) if self.script else "running"
        if isinstance(item, BaseException):
            raise item
        return item

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        return {}


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    # The follower's 1-2 s pacing, skipped; restored after the test (single-threaded here).
    monkeypatch.setattr(drill.time, "sleep", lambda _s: None)


def follow(api: ScriptedApi, lines: list[str], *, deadline_s: float = 60.0) -> str:
    return drill._follow(
        api,  # type: ignore[arg-type]
        "training_run",
        "r1",
        deadline=time.monotonic() + deadline_s,
        say=lines.append,
        progress=None,
    )


@pytest.mark.parametrize(
    "error", [requests.ReadTimeout("read timed out"), requests.ConnectionError("refused")]
)
def test_a_slow_or_unreachable_api_is_polled_again(error: Exception) -> None:
    lines: list[str] = []
    api = ScriptedApi(["running", error, error, "success"])
    assert follow(api, lines) == "success"
    assert api.calls == 4
    assert sum("did not answer" in line for line in lines) == 2, lines


def test_other_errors_still_end_the_follow() -> None:
    api = ScriptedApi([AirflowApiError("GET /dags/x: HTTP 403")])
    with pytest.raises(AirflowApiError, match="403"):
        follow(api, [])


def test_the_deadline_still_bounds_an_api_that_never_answers() -> None:
    api = ScriptedApi([requests.ReadTimeout("t")] * 10_000)
    with pytest.raises(drill.DrillError, match="did not finish in time"):
        follow(api, [], deadline_s=0.05)
