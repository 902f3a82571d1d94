"""Commands inside a running job's allocation, from outside it (the orchestrator): a one-task step on a
node the job holds and the steps it runs, through the job's `SlurmClient` (the batch host: `SlurmClient.batch_host`).

srun must be run by the job's user, root or a Slurm operator. A step on a node where another step of the
job runs needs `overlap` (else "Requested nodes are busy"); a step on a node that is then released
from the job is killed (measured on Slurm 22.05: exit 137).
"""

from __future__ import annotations

from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import SlurmCommandError, SlurmUnavailableError
from longrun.slurm.models import CommandResult, JobStep


def run_step(
    client: SlurmClient,
    job_id: int,
    node: str,
    argv: tuple[str, ...],
    *,
    timeout_s: float,
    overlap: bool = False,
) -> CommandResult:
    """Run `argv` as a one-task step of job `job_id` on `node` (which the job must hold). A bad node name
    or command (an option first, NUL bytes) raises ValueError before anything runs."""
    return client.run_in_job(job_id, node, argv, timeout_s=timeout_s, overlap=overlap)


def job_steps(client: SlurmClient, job_id: int) -> list[JobStep]:
    """(step id, step name) of every step the job runs now, as `squeue -s` lists them. RuntimeError when
    Slurm cannot answer: then nothing can be said about the job's steps. A bad job id raises ValueError."""
    try:
        return client.job_steps(job_id)
    except (SlurmCommandError, SlurmUnavailableError) as err:
        raise RuntimeError(f"the steps of job {job_id} are unknown: {err}") from err
