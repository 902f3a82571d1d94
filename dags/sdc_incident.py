"""`sdc_incident`: from an SDC alert to a drained, diagnosed node and a relaunch from a clean checkpoint.

open the record -> freeze the job (beside: attribute; ambiguous -> drain nothing, fail, runbook) ->
[approve] -> drain (rate-limited, longrun's reason) -> then side by side: diagnose (probe + DCGM on the
suspect in a MAINT reservation, or as a step of the kept job on the hot-spare path; drained again with
the verdict) and pick the pre-incident checkpoint ->
[approve] -> relaunch (node excluded, drill off, resumed) -> re-enter monitoring (a new `training_run`
run attached to the job) -> summary.

Triggered by `training_run` with the alert as conf (run id `incident__<alert id>`), or by hand with
`run_name` and `alert_key`. The alert, its run and job, and the mode and spec of the launch that ran
that job are read from the store (longrun.incident.origin); conf values that disagree with them are
refused. Nothing is acted on unless the alert is signed by that job's key, names this run and job, and
its suspect nodes are in the job's allocation (else a security event); conf keys the DAG does not
declare are refused. An alert whose content another incident already handles joins that incident. Modes (the run's `incident_mode`): act, approve (human-in-the-loop approval
before the drain and before the relaunch), observe (records what would be done, changes nothing).
Every step is idempotent through the incident record; the work is in `longrun.incident`, the task bodies
in `longrun.tasks.sdc_incident`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param, dag, task
from longrun.incident.approval import safe_text
from longrun.monitor.handover import ReenterOperator

ALERT, RUN = "Alert", "Run"
CRITICAL = 10
"""priority_weight of the tasks between the alert and the relaunch (the rest: 1)."""
# Alert-derived values reach the approval text only through `longrun_safe` (escaped, inert Markdown).
SUMMARY = "{{ ti.xcom_pull(task_ids='attribute') | longrun_safe }}"


@dag(
    dag_id="sdc_incident",
    is_paused_upon_creation=False,  # longrun hands work to it; paused, that work would wait unseen
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,
    render_template_as_native_obj=True,
    user_defined_filters={"longrun_safe": safe_text},
    tags=["longrun", "incident"],
    doc_md=__doc__,
    # Absolute weights: the executor starts the alert's critical path (CRITICAL) before the tasks beside
    # it when they are queued together; on a busy orchestrator each task start-up costs ~1 s of CPU.
    default_args={"retries": 2, "retry_delay": timedelta(seconds=3), "weight_rule": "absolute"},
    params={
        "run_name": Param(
            "demo", type="string", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", title="Run name", section=RUN
        ),
        "alert_key": Param(
            "runs/demo/alerts/00000001-finite-r000-0.json",
            type="string",
            pattern=r"^runs/[A-Za-z0-9._-]+/alerts/[A-Za-z0-9._-]+\.json$",
            title="Alert record key",
            description="Store key of the alert (runs/<run>/alerts/<step>-<check>-<id>.json)",
            section=ALERT,
        ),
        "alert": Param(
            None,
            type=["null", "object"],
            title="Alert record",
            description="The alert itself (read from the store by key when null)",
            section=ALERT,
        ),
        "job_id": Param(None, type=["null", "integer"], minimum=1, title="Slurm job", section=RUN),
        "run_params": Param(
            {},
            type="object",
            title="The run's training_run params",
            description="A claim, checked against the run's launch record (its mode and spec are used)",
            section=RUN,
        ),
        "alert_seen_at": Param(
            None,
            type=["null", "number"],
            title="Alert seen at",
            description="When the monitor saw the alert (epoch seconds; set by training_run)",
            section=ALERT,
        ),
    },
)
def sdc_incident() -> None:
    @task(retries=3, priority_weight=CRITICAL)
    def open_record(params: dict[str, Any], run_id: str) -> dict[str, Any]:
        from longrun.tasks.sdc_incident import open_task

        return open_task(params, run_id)

    @task(priority_weight=CRITICAL + 1)  # the longest of the tasks beside it (it gates checkpoints)
    def freeze(params: dict[str, Any], run_id: str) -> dict[str, Any]:
        from longrun.tasks.sdc_incident import freeze_task

        return freeze_task(params, run_id)

    # Retried like every step (the DAG's default): the attribution is recomputed from the alert and
    # recorded once, its node-history note is a no-op when already there, and an ambiguous verdict stops
    # the incident with AirflowFailException, which is never retried. Without retries a task process lost
    # here (SIGKILL, OOM, a worker restart) failed the incident before the drain (chaos cell attribute-task).
    @task(priority_weight=CRITICAL)
    def attribute(params: dict[str, Any], run_id: str) -> dict[str, Any]:
        from longrun.tasks.sdc_incident import attribute_task

        return attribute_task(params, run_id)

    @task.branch
    def drain_gate(opened: dict[str, Any]) -> str:
        return "approve_drain" if opened["mode"] == "approve" else "drain"

    approve_drain = ApprovalOperator(
        task_id="approve_drain",
        subject="SDC incident: drain the suspect node?",
        body="Attribution: "
        + SUMMARY
        + "\n\nApprove to drain and diagnose it; reject to leave it in service.",
        response_timeout=timedelta(hours=4),
    )

    @task(trigger_rule="none_failed_min_one_success", priority_weight=CRITICAL)
    def drain(
        params: dict[str, Any], run_id: str, attributed: dict[str, Any], opened: dict[str, Any]
    ) -> dict[str, Any]:
        from longrun.tasks.sdc_incident import drain_task

        return drain_task(params, run_id, attributed["node"], approved=opened["mode"] == "approve")

    @task(execution_timeout=timedelta(minutes=30))
    def diagnose(params: dict[str, Any], run_id: str, attributed: dict[str, Any]) -> dict[str, Any]:
        from longrun.tasks.sdc_incident import diagnose_task  # inside a kept job, else a MAINT reservation

        return diagnose_task(params, run_id, attributed["node"])

    @task(priority_weight=CRITICAL)
    def pick_checkpoint(params: dict[str, Any], run_id: str) -> dict[str, Any]:
        from longrun.tasks.sdc_incident import pick_task

        return pick_task(params, run_id)

    @task.branch
    def relaunch_gate(opened: dict[str, Any]) -> str:
        return "approve_relaunch" if opened["mode"] == "approve" else "relaunch"

    approve_relaunch = ApprovalOperator(
        task_id="approve_relaunch",
        subject="SDC incident: relaunch the run?",
        body="Resume from: {{ ti.xcom_pull(task_ids='pick_checkpoint') | longrun_safe }}\n\nApprove to relaunch without the node.",
        response_timeout=timedelta(hours=4),
    )

    @task(trigger_rule="none_failed_min_one_success", priority_weight=CRITICAL)
    def relaunch(
        params: dict[str, Any], run_id: str, attributed: dict[str, Any], checkpoint: dict[str, Any]
    ) -> dict[str, Any]:
        from longrun.tasks.sdc_incident import relaunch_task

        return relaunch_task(params, run_id, attributed["node"], checkpoint)

    reenter = ReenterOperator(task_id="reenter_monitoring")

    @task(trigger_rule="all_done", retries=1)
    def summary(params: dict[str, Any], run_id: str) -> dict[str, Any]:
        from longrun.tasks.sdc_incident import summary_task

        return summary_task(params, run_id)

    opened = open_record()
    frozen = freeze()
    attributed = attribute()
    gate1 = drain_gate(opened)
    drained = drain(attributed=attributed, opened=opened)
    diagnosed = diagnose(attributed=attributed)
    picked = pick_checkpoint()
    gate2 = relaunch_gate(opened)
    relaunched = relaunch(attributed=attributed, checkpoint=picked)
    done = summary()

    # The freeze waits (bounded) for the job to finish its uploads and exit; attribution and the drain
    # do not need it gone (a drain never stops a running job). The relaunch excludes the drained node
    # whatever the diagnosis finds, so the diagnosis runs beside the pick and the relaunch instead of
    # in front of them: recovery does not wait for it. The summary waits for both.
    # The two gates read only the mode, so they run beside attribute and pick instead of after them: in
    # act mode no gate stands on the alert's critical path (open -> attribute -> drain -> pick -> relaunch).
    # An approval still waits for what it shows (the attribution; the picked checkpoint).
    opened >> [frozen, attributed]
    gate1 >> [approve_drain, drained]
    attributed >> [approve_drain, drained]
    approve_drain >> drained
    [drained, frozen] >> diagnosed
    [drained, frozen] >> picked >> [approve_relaunch, relaunched]
    gate2 >> [approve_relaunch, relaunched]
    approve_relaunch >> relaunched >> reenter
    [reenter, diagnosed] >> done


sdc_incident()
