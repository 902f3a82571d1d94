"""`training_run`: one distributed training run on Slurm, from the Params form to a certified finish.

preflight -> submit (or attach to a relaunched job) -> monitor (deferrable: Slurm state, alerts,
heartbeat, new checkpoints validated + promoted as they appear) -> on an alert, hand over to
`sdc_incident`; on a clean end, promote the final checkpoint and write the run report.

Thin on purpose: the work is in `longrun.monitor` (trigger, operator, lifecycle) and the Slurm layer,
the task bodies in `longrun.tasks.training_run`.
After an incident, `sdc_incident` relaunches the job itself and triggers a new run of this DAG with
`attach_job_id` set, which monitors that job instead of submitting one (see docs/dags.md).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Param, dag, task
from longrun import entrypoint as ep
from longrun.monitor.handover import HandOverOperator
from longrun.monitor.operator import RunMonitorOperator
from longrun.operators.slurm import SlurmSubmitJobOperator

from training.config import PARALLELISMS
from training.records.schema import FAULT_KINDS, INCIDENT_MODES, MODEL_PRESETS

RUN, CHECKS, INCIDENT, DRILL, RELAUNCH = (
    "Run",
    "Checks and checkpoints",
    "Incident handling",
    "Drill (fault injection)",
    "Relaunch (set by sdc_incident; leave as is)",
)

PARAMS = {
    "run_name": Param(
        "demo",
        type="string",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        title="Run name",
        description="Names the store prefix runs/<run>/, the Slurm job and the run dir. 1-64 of A-Z a-z 0-9 . _ -",
        section=RUN,
    ),
    "nodes": Param(
        3, type="integer", minimum=1, maximum=4096, title="Nodes", description="Slurm nodes", section=RUN
    ),
    "spare_nodes": Param(
        0,
        type="integer",
        minimum=0,
        maximum=64,
        title="Hot spare nodes",
        description="Nodes the job holds beyond `nodes`. After an SDC verdict the run continues inside the same "
        "job on a spare (act mode; no new job, no queue). 0 = today's path: cancel and resubmit.",
        section=RUN,
    ),
    "gpus_per_node": Param(
        0,
        type="integer",
        minimum=0,
        maximum=64,
        title="GPUs per node",
        description="One rank per GPU (H100: 8). 0 = CPU ranks, one per node.",
        section=RUN,
    ),
    "ranks_per_node": Param(
        0,
        type="integer",
        minimum=0,
        maximum=64,
        title="Ranks per node",
        description="Processes started on each node. 0 = one per GPU, or one per node for CPU ranks. With GPUs: 0 "
        "or GPUs per node.",
        section=RUN,
    ),
    "parallelism": Param(
        "ddp",
        type="string",
        enum=list(PARALLELISMS),
        title="Parallelism",
        description="ddp: a whole replica per rank (all three checks). hsdp: FSDP2 within a node, replicas across "
        "nodes (2+ nodes; finite check, a forward recompute across nodes and a weight vote per shard, which name "
        "the node with 3+ nodes). fsdp: FSDP2 over every rank (finite check and forward recompute, no vote). "
        "Sharded runs: hot spares 0 (not built yet). docs/sharding.md",
        section=RUN,
    ),
    "partition": Param(
        "debug", type="string", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", title="Partition", section=RUN
    ),
    "model": Param(
        "tiny",
        type="string",
        enum=list(MODEL_PRESETS),
        title="Model preset",
        description="The reference trainer's model (entrypoint module:training.train); ignored for any other "
        "entrypoint.",
        section=RUN,
    ),
    "entrypoint": Param(
        ep.REFERENCE,
        type="string",
        pattern=ep.ENTRYPOINT_PATTERN,
        maxLength=len(ep.SCRIPT) + ep.MAX_PATH_CHARS,
        title="Entrypoint",
        description="What each rank runs: module:<dotted.name> or script:<absolute path> (inside the site's "
        f"{ep.ENTRYPOINT_DIR_ENV}). Default: the reference trainer. It must use training.api (docs/adopting.md); "
        "longrun's settings reach it as LONGRUN_* environment variables (docs/contracts.md).",
        section=RUN,
    ),
    "entrypoint_args": Param(
        [],
        # null too: the form submits an emptied field as null (and keeps Trigger disabled otherwise)
        type=["null", "array"],
        items={"type": "string", "maxLength": ep.MAX_ARG_CHARS, "pattern": ep.ARG_PATTERN},
        maxItems=ep.MAX_ARGS,
        title="Entrypoint arguments",
        description="One string per argument, passed as is (never read by a shell); no newlines.",
        section=RUN,
    ),
    "job_python": Param(
        None,
        type=["null", "string"],
        pattern=ep.JOB_PYTHON_PATTERN,
        maxLength=ep.MAX_PATH_CHARS,
        title="Job Python",
        description="The interpreter of the job's Python environment (its ft_launcher is used): one of the "
        f"site's {ep.JOB_PYTHONS_ENV}. Empty (null): the Airflow worker's own.",
        section=RUN,
    ),
    "steps": Param(
        40,
        type="integer",
        minimum=1,
        maximum=10_000_000,
        title="Steps",
        description="Optimizer steps",
        section=CHECKS,
    ),
    "checkpoint_every": Param(
        10, type="integer", minimum=1, maximum=10_000_000, title="Checkpoint every N steps", section=CHECKS
    ),
    "recompute_every": Param(
        5,
        type="integer",
        minimum=0,
        maximum=10_000_000,
        title="Cross-node recompute every N steps",
        description="0 = off",
        section=CHECKS,
    ),
    "vote_every": Param(
        5,
        type="integer",
        minimum=0,
        maximum=10_000_000,
        title="Weight vote every N steps",
        description="0 = only right before each checkpoint save",
        section=CHECKS,
    ),
    "incident_mode": Param(
        "act",
        type="string",
        enum=list(INCIDENT_MODES),
        title="Incident mode",
        description="act: drain, diagnose, relaunch. approve: a person approves the drain and the relaunch. "
        "observe: record what would be done, change nothing.",
        section=INCIDENT,
    ),
    "drill": Param(
        None,
        type=["null", "object"],
        title="Drill",
        description='null, or {"kind": one of '
        + ", ".join(FAULT_KINDS)
        + ', "step": N, "target": rank number or node name}. A node is pinned into the job; sick-node '
        "perturbs every rank on it, other kinds fire on its lowest rank. Announced loudly in the job log; "
        "never re-injected on a relaunch.",
        properties={
            "kind": {"type": "string", "enum": list(FAULT_KINDS)},
            "step": {"type": "integer", "minimum": 1},
            "target": {"type": ["string", "integer"]},
        },
        required=["kind", "step", "target"],
        additionalProperties=False,
        section=DRILL,
    ),
    "attach_job_id": Param(
        None,
        type=["null", "integer"],
        minimum=1,
        title="Attach to job",
        description="Monitor this Slurm job instead of submitting one",
        section=RELAUNCH,
    ),
    "resume_from": Param(
        None,
        type=["null", "string"],
        title="Resume from",
        description="checkpoint store prefix",
        section=RELAUNCH,
    ),
    "exclude": Param([], type="array", items={"type": "string"}, title="Excluded nodes", section=RELAUNCH),
    "attempt": Param(0, type="integer", minimum=0, maximum=1000, title="Attempt", section=RELAUNCH),
    "incident_id": Param(None, type=["null", "string"], title="After incident", section=RELAUNCH),
}


@dag(
    dag_id="training_run",
    schedule=None,
    is_paused_upon_creation=False,  # re-entering monitoring after a relaunch triggers it
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    max_active_tasks=4,
    tags=["longrun", "training"],
    doc_md=__doc__,
)
def training_run() -> None:
    @task(retries=1, retry_delay=timedelta(seconds=5))
    def preflight(params: dict[str, Any], ti: Any = None) -> dict[str, Any]:
        from longrun.tasks.training_run import preflight_task

        return preflight_task(params, ti)

    @task.branch
    def submit_or_attach(checked: dict[str, Any]) -> str:
        return "attach" if checked["attach_job_id"] is not None else "submit"

    @task
    def job_spec(params: dict[str, Any], dag_run: Any = None) -> dict[str, Any]:
        from longrun.tasks.training_run import job_task

        return job_task(params)

    @task
    def attach(checked: dict[str, Any]) -> int:
        return int(checked["attach_job_id"])

    checked = preflight()
    spec = job_spec()
    choice = submit_or_attach(checked)
    submit = SlurmSubmitJobOperator(
        task_id="submit",
        wait_for_completion=False,
        job="{{ ti.xcom_pull(task_ids='job_spec') }}",
        alert_signing_run="{{ params.run_name }}",
        retries=2,
        retry_delay=timedelta(seconds=5),
    )
    attached = attach(checked)
    monitor = RunMonitorOperator(
        task_id="monitor",
        run_name="{{ params.run_name }}",
        job_id="{{ ti.xcom_pull(task_ids='submit') or ti.xcom_pull(task_ids='attach') }}",
        trigger_rule="none_failed_min_one_success",
        # Airflow 3.3.2's deferral race (apache/airflow#71580) failed 4 tries in a row once under load; a
        # retry only reattaches to the same job (never submits), so retries are cheap. The trigger holds
        # checkpoint events for CHECKPOINT_SETTLE_S so that checkpoint resumes stay out of that race;
        # these retries are what is left for the rest (docs/reliability.md).
        retries=8,
        retry_delay=timedelta(seconds=5),
    )

    # No branch task between the monitor and these two: each skips itself on the other's outcome, so the
    # hand-over starts one task start-up sooner after an alert, which is on the critical path.
    hand_over = HandOverOperator(task_id="hand_over")

    @task
    def finish(result: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        from longrun.tasks.training_run import finish_task

        return finish_task(result, params)

    checked >> spec >> choice >> [submit, attached]
    [submit, attached] >> monitor
    monitor >> [hand_over, finish(monitor.output)]


training_run()
