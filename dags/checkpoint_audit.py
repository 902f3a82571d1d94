"""`checkpoint_audit`: Great Expectations over every model checkpoint manifest, validation, promotion,
suspect interval and incident record in the store, plus a seeded re-hash sample; Data Docs and JSON to
the store under `audit/<run id>/`. Daily, and on demand from the UI (Trigger with the Params form).

Thin on purpose: the work is in `longrun.audit`, the task body in `longrun.tasks.checkpoint_audit`. A
failed audit fails the task without retries, with a message that names each broken property and links
runbooks/audit-failed.md.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Param, dag, task


@dag(
    dag_id="checkpoint_audit",
    is_paused_upon_creation=False,  # a paused daily audit silently never runs
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["longrun", "audit"],
    doc_md=__doc__,
    params={
        "sample_size": Param(
            16,
            type="integer",
            minimum=0,
            maximum=100000,
            description="Stored payload files to download and re-hash",
        ),
        "seed": Param(0, type="integer", description="Seed of the re-hash sample (same seed, same files)"),
        "runs": Param(
            [],
            type="array",
            items={"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
            maxItems=1000,
            description="Audit only these runs (empty: every run in the store, as the daily audit does)",
        ),
        "loss_min": Param(0.0, type="number", description="Lowest loss a manifest may record"),
        "loss_max": Param(10000.0, type="number", description="Highest loss a manifest may record"),
        "healthy_steps": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=1000000,
            description="Close a relaunched incident after this many healthy steps (empty: the Variable"
            " longrun_healthy_steps, else 20)",
        ),
    },
)
def checkpoint_audit() -> None:
    @task(retries=2, retry_delay=timedelta(minutes=2), execution_timeout=timedelta(hours=2))
    def audit(params: dict[str, Any], run_id: str) -> dict[str, Any]:
        from longrun.tasks.checkpoint_audit import audit_task  # pandas and GX only when the task runs

        return audit_task(params, run_id)

    audit()


checkpoint_audit()
