"""The run ids of the hand-overs between the DAGs: one definition for the operators that create them and
the drill, the tests and the runbooks that find them. Pure: no Airflow here."""

from __future__ import annotations

from training.records.schema import incident_id_for


def incident_run_id(alert_key: str) -> str:
    """`sdc_incident`'s run id for the alert at `alert_key`: `incident__<incident id>` (one per alert)."""
    return f"incident__{incident_id_for(alert_key)}"


def attempt_run_id(run: str, attempt: int) -> str:
    """`training_run`'s run id for relaunch `attempt` of `run`: `<run>__attempt<N>`."""
    return f"{run}__attempt{attempt}"
