"""One table from a job's final state (and exit code) to what the orchestrator does next.

    success    the job did its work
    retryable  the job ended for a reason outside it (node failure, preemption): submit it again
    terminal   retrying cannot help (its own failure, cancel, time limit, SDC verdict, restarts used up)
    running    not final yet: keep waiting (pending, running, requeued, suspended)

The SDC verdict code (93, the exit code NVRx 0.5+ reserves for "do not restart", which longrun's trainer
uses when a check convicts a node) is terminal whatever the state says: restarting on the same nodes
would repeat the corruption; the incident DAG takes over instead.

A pending job Slurm itself holds after a failed launch (`held_after_failed_launch`) is "running" by this
table, yet it never starts until someone releases it: the monitor raises it on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from longrun.slurm.models import JobState, JobStatus
from training.records.schema import (
    EXIT_SDC_VERDICT as SDC_EXIT_CODE,  # the trainer's "SDC verdict, do not restart"
)


class Kind(StrEnum):
    SUCCESS = "success"
    RETRYABLE = "retryable"
    TERMINAL = "terminal"
    RUNNING = "running"


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """The verdict on one job state."""

    kind: Kind
    """What to do next."""
    label: str
    """A short stable name for logs, metrics and tests (e.g. `node_fail`, `sdc_verdict`)."""
    state: JobState
    """The state the verdict is about."""

    @property
    def message(self) -> str:
        return f"{self.label}: {self.state.describe()}"


# (status) -> (kind, label). Exit codes refine FAILED below; restarts are checked before this table.
TABLE: dict[JobStatus, tuple[Kind, str]] = {
    JobStatus.COMPLETED: (Kind.SUCCESS, "completed"),
    JobStatus.FAILED: (Kind.TERMINAL, "failed"),
    JobStatus.CANCELLED: (Kind.TERMINAL, "cancelled"),
    JobStatus.TIMEOUT: (Kind.TERMINAL, "timeout"),
    JobStatus.OUT_OF_MEMORY: (Kind.TERMINAL, "out_of_memory"),
    JobStatus.DEADLINE: (Kind.TERMINAL, "deadline"),
    JobStatus.NODE_FAIL: (Kind.RETRYABLE, "node_fail"),
    JobStatus.PREEMPTED: (Kind.RETRYABLE, "preempted"),
    JobStatus.BOOT_FAIL: (Kind.RETRYABLE, "boot_fail"),
    JobStatus.PENDING: (Kind.RUNNING, "pending"),
    JobStatus.RUNNING: (Kind.RUNNING, "running"),
    JobStatus.SUSPENDED: (Kind.RUNNING, "suspended"),
    JobStatus.REQUEUED: (Kind.RUNNING, "requeued"),
    JobStatus.UNKNOWN: (Kind.RUNNING, "unknown"),
}


#: How Slurm describes a job it requeued and held because its launch failed (slurmctld's job_mgr: a
#: prolog that failed, a node that already ran the job after slurmctld lost its state, a user environment
#: it could not fetch). scontrol prints the description with underscores, pyslurm and squeue's JSON with
#: spaces; both forms are read. longrun's own `scontrol requeuehold` reads "job requeued in held state"
#: and `scontrol hold` "JobHeldAdmin"/"JobHeldUser": holds someone chose, not failures.
LAUNCH_FAILED_HOLDS = ("launch failed requeued held", "user env retrieval failed requeued held")


def held_after_failed_launch(state: JobState) -> bool:
    """Slurm holds the pending job because its launch failed; it stays pending at priority 0 until an
    operator releases it (`scontrol release`)."""
    reason = (state.reason or "").replace("_", " ").lower()
    pending = state.status in (JobStatus.PENDING, JobStatus.REQUEUED)  # requeued: pending, restarts > 0
    return pending and any(r in reason for r in LAUNCH_FAILED_HOLDS)


def classify(state: JobState, *, max_restarts: int | None = None) -> Outcome:
    """The outcome of `state`; with `max_restarts`, a job Slurm restarted more often than that is terminal."""
    if state.exit_code == SDC_EXIT_CODE and state.status is not JobStatus.COMPLETED:
        return Outcome(kind=Kind.TERMINAL, label="sdc_verdict", state=state)
    if (
        max_restarts is not None
        and state.restart_count > max_restarts
        and state.status is not JobStatus.COMPLETED
    ):
        return Outcome(kind=Kind.TERMINAL, label="restarts_exhausted", state=state)
    kind, label = TABLE[state.status]
    return Outcome(kind=kind, label=label, state=state)
