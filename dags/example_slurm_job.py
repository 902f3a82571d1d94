"""Example (and system test) of longrun's Slurm operators.

`example_slurm_job`: submit a small CPU job, then wait for it with the deferrable sensor.
`example_slurm_job_fails`: submit-and-wait on a job that exits 3; the task fails with Slurm's state,
reason and exit code, without a retry although it has retries: a job's own failure is terminal.

Retries are on for the success path because of an Airflow 3.3 scheduler race (apache/airflow#71580,
#72716): when a trigger fires within seconds of the deferral, the stale "success" of the deferring
worker can mark the resumed task failed. A retry then reattaches to the same Slurm job (task state
store / job tag) instead of submitting it again, so the race costs a few seconds, not a second job.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param
from longrun.operators.slurm import SlurmSubmitJobOperator
from longrun.sensors.slurm import SlurmJobSensor

PARAMS = {
    "partition": Param("debug", type="string", description="Slurm partition"),
    "nodes": Param(1, type="integer", minimum=1, maximum=4, description="nodes for the job"),
}
DEFAULT_ARGS = {"retries": 2, "retry_delay": timedelta(seconds=2)}
# Job logs go to /tmp on the node, not into the DAG processor's or worker's working directory.
COMMON = {
    "gpus_per_node": 0,
    "exclusive": False,
    "time_limit_min": 5,
    "workdir": "/tmp",
    "output": "longrun-example-%j.out",
}

with DAG(
    dag_id="example_slurm_job",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    default_args=DEFAULT_ARGS,
    tags=["longrun", "example", "slurm"],
):
    submit = SlurmSubmitJobOperator(
        task_id="submit",
        wait_for_completion=False,
        job={
            **COMMON,
            "name": "example-ok",
            "partition": "{{ params.partition }}",
            "nodes": "{{ params.nodes }}",
            "command": ["srun bash -c 'echo rank $SLURM_NODEID on $SLURMD_NODENAME'", "sleep 2"],
        },
    )
    wait = SlurmJobSensor(
        task_id="wait",
        job_id="{{ ti.xcom_pull(task_ids='submit') }}",
        poll_interval=1.0,
        timeout=600,
    )
    submit >> wait

with DAG(
    dag_id="example_slurm_job_fails",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    default_args=DEFAULT_ARGS,
    tags=["longrun", "example", "slurm"],
):
    SlurmSubmitJobOperator(
        task_id="submit_and_wait",
        job={
            **COMMON,
            "name": "example-fail",
            "partition": "{{ params.partition }}",
            "nodes": 1,
            "command": ["echo about to fail", "exit 3"],
        },
    )
