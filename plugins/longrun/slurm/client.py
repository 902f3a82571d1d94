"""The Slurm client interface: everything longrun asks of Slurm, whichever backend answers.

Two backends implement `SlurmClient`: `cli_backend.CliSlurmClient` (sbatch, squeue, sinfo, scontrol,
scancel, srun) and `pyslurm_backend.PyslurmClient` (used only where pyslurm imports and was built for the
cluster's Slurm version); `factory.make_client` picks one. The values they return are in `models`.
Operations built from several calls (requeue-excluding, diagnosing a drained node) live in `ops.py` on top
of this interface, so every backend gets them. Nothing else in longrun runs a Slurm command (but the local
stack's start and stop checks, `longrun.stack`, which manage a test cluster rather than use one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from longrun.slurm.models import CommandResult, JobState, JobStep, NodeState
from longrun.slurm.spec import JobSpec


@runtime_checkable
class SlurmClient(Protocol):
    """Everything longrun asks of Slurm. Each call is one round trip or a short bounded wait."""

    backend: str

    def version(self) -> str:
        """Slurm version of the cluster, e.g. `22.05.8`."""
        ...

    def submit(self, spec: JobSpec, *, secret_env: Mapping[str, str] | None = None) -> int:
        """Submit `spec` (rendered by `render_sbatch`) and return the job id. `secret_env` reaches the job
        by name (exported from sbatch's environment), never through the script. A spec with `run_as` is
        submitted by sbatch running as that user (`longrun.slurm.job_user`), so the job has that user's
        rights; every other call here stays the caller's own."""
        ...

    def job(self, job_id: int) -> JobState:
        """State of one job, from the controller or, once it forgot the job, from the durable record."""
        ...

    def jobs(self) -> list[JobState]:
        """Every job the controller still knows."""
        ...

    def find_jobs(self, tag_prefix: str) -> list[JobState]:
        """Jobs whose comment starts with `tag_prefix`, newest first."""
        ...

    def cancel(self, job_id: int) -> None: ...

    def requeue_hold(self, job_id: int) -> None:
        """Stop the job and put it back in the queue, held (it will not start until released)."""
        ...

    def set_excluded(self, job_id: int, nodes: tuple[str, ...]) -> None:
        """Replace a pending job's excluded nodes and make it eligible now."""
        ...

    def release(self, job_id: int) -> None: ...

    def node(self, name: str) -> NodeState: ...

    def nodes(self) -> list[NodeState]: ...

    def drain(self, node: str, reason: str) -> None:
        """Drain `node`; `reason` must start with longrun's prefix."""
        ...

    def resume(self, node: str) -> None:
        """Undrain `node`; raises ForeignDrainError unless its reason carries longrun's prefix."""
        ...

    def create_maint_reservation(self, name: str, nodes: tuple[str, ...], duration_min: int) -> str:
        """Create a `maint,ignore_jobs` reservation starting now; returns its name."""
        ...

    def delete_reservation(self, name: str) -> None: ...

    def reservations(self) -> list[str]: ...

    def run_in_reservation(
        self, reservation: str, node: str, argv: tuple[str, ...], *, timeout_s: float
    ) -> CommandResult:
        """Run `argv` as a one-task step on `node` inside `reservation` (srun) and capture it."""
        ...

    # -- inside a running job: what the hot-spare path (longrun.incident.hot_spare) asks of Slurm ----
    def job_steps(self, job_id: int) -> list[JobStep]:
        """The steps job `job_id` runs now, as `squeue --steps` lists them (Slurm's own `batch` and `extern`
        steps included); [] for a job that runs none: pending, ended, or no longer known to Slurm. Raises
        SlurmError when Slurm cannot answer: then nothing can be said about the job's steps, and a caller
        waiting for a step to end must not read that as "ended"."""
        ...

    def batch_host(self, job_id: int) -> str | None:
        """The node that runs job `job_id`'s batch script (its supervisor). Releasing that node from the job
        (`shrink_job`) would kill the script, so a caller never does. None when the job has no batch host
        (it has not started) or Slurm no longer knows the job; raises SlurmError when Slurm cannot answer."""
        ...

    def shrink_job(self, job_id: int, nodes: tuple[str, ...]) -> None:
        """Shrink running job `job_id` to `nodes`, plain node names it holds (`scontrol update NodeList=`);
        the other nodes leave the job and keep their state (a drained node stays drained), and a step still
        running there is killed. Raises SlurmCommandError when Slurm refuses (Slurm 22.05 without
        accounting shrinks a job only once), InvalidSpecError before any call for a bad job id or name."""
        ...

    def run_in_job(
        self, job_id: int, node: str, argv: tuple[str, ...], *, timeout_s: float, overlap: bool = False
    ) -> CommandResult:
        """Run `argv` as a one-task step of running job `job_id` on `node`, which the job holds (srun), and
        capture it. The step runs as the job's own user (Slurm creates steps for no one else), with the
        job's rights. `overlap` shares the node with a step already running there (else Slurm answers
        "Requested nodes are busy"). Past `timeout_s` the step is cancelled (exit code 124)."""
        ...
