"""No silent paused path: longrun's own DAGs start unpaused on a fresh stack, training_run refuses to start
in act/approve mode while sdc_incident is paused, and the hand-overs fail loudly on a paused DAG.

The real-stack test relies on nothing in the suite unpausing these DAGs: `test_nothing_unpauses_our_dags`
keeps it that way, so "unpaused" below is what the stack did by itself."""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from types import SimpleNamespace

import pytest
from longrun.paused import DagPaused, require_unpaused

ROOT = Path(__file__).resolve().parents[2]
OURS = ("training_run", "sdc_incident", "checkpoint_audit")


class _Ti:
    """Stands in for the task instance's `get_dag` (the Task SDK's call to the API server)."""

    def __init__(self, paused: dict[str, bool]) -> None:
        self.paused = paused

    def get_dag(self, dag_id: str) -> SimpleNamespace:
        if dag_id not in self.paused:
            raise LookupError(f"404 dag {dag_id}")
        return SimpleNamespace(dag_id=dag_id, is_paused=self.paused[dag_id])


def test_require_unpaused_names_the_dag_the_fix_and_the_runbook() -> None:
    require_unpaused(_Ti({"sdc_incident": False}), "sdc_incident", why="x")
    with pytest.raises(DagPaused) as e:
        require_unpaused(_Ti({"sdc_incident": True}), "sdc_incident", why="alerts would never be handled")
    text = str(e.value)
    assert "sdc_incident is paused" in text and "airflow dags unpause sdc_incident" in text
    assert "runbooks/dag-paused.md" in text and "alerts would never be handled" in text
    with pytest.raises(DagPaused, match="not available"):
        require_unpaused(_Ti({}), "sdc_incident", why="x")


def test_nothing_unpauses_our_dags() -> None:
    """Only an operator unpauses: no code or test of ours PATCHes our DAGs unpaused."""
    ours = re.compile(r"\b(" + "|".join(OURS) + r")\b")
    unpause = re.compile(r"unpause\(|is_paused\W+False")
    hits = []
    for path in [*ROOT.joinpath("plugins").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py")]:
        if path.name == Path(__file__).name:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if unpause.search(line) and ours.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert hits == []


@pytest.mark.airflow
def test_fresh_stack_runs_incidents_without_unpausing(airflow_stack) -> None:
    from helpers.airflow_api import AirflowApi

    api = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password, timeout=60)
    for dag_id in OURS:
        api.wait_dag_parsed(dag_id, timeout=180)
        assert api.dag(dag_id)["is_paused"] is False, dag_id

    # An operator pauses sdc_incident: a run in act mode is refused at preflight, before anything reaches Slurm.
    api.pause("sdc_incident")
    try:
        run = f"paused-{secrets.token_hex(3)}"
        run_id = api.trigger("training_run", conf={"run_name": run, "nodes": 3, "incident_mode": "act"})
        assert api.wait_run("training_run", run_id, timeout=240) == "failed"
        states = api.task_states("training_run", run_id)
        assert states["preflight"] == "failed" and states.get("submit") in (None, "upstream_failed"), states
        # The latest try: a first try that never started on a freshly started, loaded stack (its worker
        # timed out reaching the API) leaves no try-1 log, and the retry is the one that refuses.
        log = api.task_log("training_run", run_id, "preflight")
        assert "DAG sdc_incident is paused" in log and "runbooks/dag-paused.md" in log, log[-2000:]
    finally:
        api.request("PATCH", "/dags/sdc_incident", json={"is_paused": False})  # restore the stack as found
