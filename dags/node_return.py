"""`node_return`: return a node that longrun drained to service, only on clean repeated evidence.

select (drained by longrun, not diag-fail, not a repeat offender; else recorded and refused) -> probe
(the replay probe, + `dcgmi diag` where present, `repeats` times in a MAINT reservation; the first
unclean round stops and keeps the node drained) -> [approve: a Reject skips resume] -> resume (only a
clean node that still carries longrun's diag-pass reason) -> summary (records a rejection in the node's
history; fails when a requested node was not returned).

Triggered by an operator with `node`, or on its schedule for the `diag-pass` nodes when the Variable
`longrun_node_policy` sets `auto_return`. Modes: act, approve (a person approves the resume), observe
(probe nothing, change nothing, record what would be done). The work is in `longrun.nodes` and
`longrun.health`, the task bodies in `longrun.tasks.node_return`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param, dag, task


@dag(
    dag_id="node_return",
    schedule="@hourly",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    is_paused_upon_creation=False,
    max_active_runs=1,
    tags=["longrun", "nodes"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    params={
        "node": Param(
            None,
            type=["null", "string"],
            pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$",
            title="Node",
            description="The node to return (empty: the diag-pass nodes, if auto_return is on)",
        ),
        "mode": Param("act", enum=["act", "approve", "observe"], title="Mode"),
        "repeats": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=20,
            title="Diagnostic rounds",
            description="Every round must pass (empty: the policy's probe_repeats)",
        ),
    },
)
def node_return() -> None:
    @task(retries=0)
    def select(params: dict[str, Any], run_id: str) -> dict[str, Any]:
        from longrun.tasks.node_return import select_task

        return select_task(params, run_id)

    @task(execution_timeout=timedelta(minutes=60), retries=0)
    def probe(selected: dict[str, Any], run_id: str) -> list[dict[str, Any]]:
        from longrun.tasks.node_return import probe_task

        return probe_task(selected, run_id)

    @task.branch
    def gate(selected: dict[str, Any]) -> str:
        return "approve_return" if selected["mode"] == "approve" else "resume"

    approve_return = ApprovalOperator(
        task_id="approve_return",
        subject="Return drained node(s) to service?",
        body="Every diagnostic round passed; the probe rounds are in the `probe` task's log and the node"
        " history (`longrun nodes show NODE`).\n\nApprove to resume; reject to keep the node drained.",
        response_timeout=timedelta(hours=24),
        # Airflow 3.3.2's deferral race can fail a try as it parks and again as it resumes with the answer
        # (seen in CI: try 1 failed on parking, try 2 a moment after the Approve); each retry asks again.
        retries=3,
    )

    @task(trigger_rule="none_failed_min_one_success")
    def resume(selected: dict[str, Any], probed: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
        from longrun.tasks.node_return import resume_task

        return resume_task(selected, probed, run_id)

    @task(trigger_rule="all_done", retries=0)
    def summary(
        selected: dict[str, Any],
        probed: list[dict[str, Any]] | None,
        resumed: list[dict[str, Any]] | None,
        run_id: str,
        ti: Any = None,
    ) -> dict[str, Any]:
        from airflow.providers.standard.utils.skipmixin import XCOM_SKIPMIXIN_KEY
        from longrun.tasks.node_return import summary_task

        # Pulled, not passed: a task fed by approve_return would be skipped with `resume` on a Reject.
        # A Reject pushes no return value (the skip ends the task first), only the skip record.
        approval = ti.xcom_pull(task_ids="approve_return") if ti is not None else None
        skipped = ti.xcom_pull(task_ids="approve_return", key=XCOM_SKIPMIXIN_KEY) if ti is not None else None
        return summary_task(
            selected, resumed, probed=probed, approval=approval, skipped=skipped, dag_run_id=run_id
        )

    selected = select()
    probed = probe(selected)
    g = gate(selected)
    resumed = resume(selected, probed)
    probed >> g >> [approve_return, resumed]
    approve_return >> resumed
    summary(selected, probed, resumed)


node_return()
