"""A paused DAG that longrun hands work to is a silent dead end: the triggered run sits queued and nobody
is told. These checks turn it into a loud failure that names the DAG, the fix and the runbook.

Our DAGs are declared `is_paused_upon_creation=False`, so a fresh stack never has this problem; an
operator (or an older stack's database) can still pause one. Tasks ask Airflow through the task
instance's `get_dag` (the Task SDK's call to the API server), never the metadata database.
"""

from __future__ import annotations

from typing import Any, Protocol

from airflow.sdk.exceptions import AirflowFailException

from longrun.runbooks import runbook_url

INCIDENT_DAG = "sdc_incident"
#: incident modes in which an alert must reach a running `sdc_incident` to be handled.
MODES_NEEDING_INCIDENTS = ("act", "approve")


class DagPaused(AirflowFailException):
    """A DAG longrun must hand work to is paused (or not parsed). Terminal: retrying would not unpause it."""


class _DagLookup(Protocol):
    def get_dag(self, dag_id: str) -> Any: ...


def require_unpaused(ti: _DagLookup, dag_id: str, *, why: str) -> None:
    """Raise DagPaused when `dag_id` is paused or unknown to Airflow; `why` says what would be lost."""
    try:
        dag = ti.get_dag(dag_id)
    except Exception as e:  # the API answers 404 for a DAG that was never parsed
        raise DagPaused(
            f"DAG {dag_id} is not available ({type(e).__name__}: {e}); {why}. Check the dag-processor's import "
            f"errors. Runbook: {runbook_url('dag_paused')}"
        ) from e
    if getattr(dag, "is_paused", False):
        raise DagPaused(
            f"DAG {dag_id} is paused, so {why}. Unpause it (`airflow dags unpause {dag_id}`, or the toggle in "
            f"the Airflow UI), then clear this task. Runbook: {runbook_url('dag_paused')}"
        )
