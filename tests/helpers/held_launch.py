"""What an operator does for runbooks/job-held-after-failed-launch.md, as a `run_drill` operator.

Used where a test makes (the stack's fail-launch prolog) or meets (a slurmctld killed just after an
allocation, in the fault matrix) a job that Slurm requeued held after a failed launch.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Collection

from longrun.airflow_rest import AirflowRest
from longrun.slurm.client import SlurmClient
from longrun.slurm.outcomes import held_after_failed_launch

RUNBOOK = "job-held-after-failed-launch"


def follow_runbook(
    rest: AirflowRest,
    client: SlurmClient,
    run: str,
    dag_id: str,
    run_id: str,
    done: dict,
    *,
    resume_reasons: Collection[str],
    before: Callable[[], None] = lambda: None,
) -> bool:
    """Called when a followed DAG run failed. Acts only for a training_run whose monitor failed naming the
    runbook while Slurm holds the run's job after a failed launch, and once (`done["runbook"]` says what
    was done). As the runbook says: `before()` (the cause put right), resume the nodes Slurm drained for
    it (reason starting with one of `resume_reasons`), release the job and start it now, clear the
    monitor and its downstream tasks (`done["failed_try"]`: the monitor's state and try number before
    the clear). Any other failure stands (False)."""
    if dag_id != "training_run" or "runbook" in done:
        return False
    held = [j for j in client.jobs() if j.name == run and held_after_failed_launch(j)]
    if len(held) != 1:
        return False
    if RUNBOOK not in rest.task_log(dag_id, run_id, "monitor"):  # what the operator sees
        return False
    before()
    resume_drained_for(client, resume_reasons)
    client.release(held[0].job_id)
    # Slurm gives a requeued job a begin time ~2 minutes out; the runbook starts it now.
    argv = ["scontrol", "update", f"JobId={held[0].job_id}", "StartTime=now"]
    subprocess.run(argv, env=dict(os.environ), check=True)
    monitor = next(ti for ti in rest.task_instances(dag_id, run_id) if ti["task_id"] == "monitor")
    done["failed_try"] = (monitor["state"], monitor["try_number"])
    cleared = rest.clear_tasks(dag_id, run_id, ["monitor"])
    done["runbook"] = f"{RUNBOOK}: job {held[0].job_id} released, cleared {sorted(cleared)}"
    return True


def resume_drained_for(client: SlurmClient, reasons: Collection[str], *, check: bool = True) -> None:
    """Resume the nodes drained with a reason starting with one of `reasons` (Slurm's own drains, which
    longrun's client does not resume)."""
    for node in client.nodes():
        if node.drain_flag and (node.reason or "").startswith(tuple(reasons)):
            argv = ["scontrol", "update", f"NodeName={node.name}", "State=RESUME"]
            subprocess.run(argv, env=dict(os.environ), check=check)
