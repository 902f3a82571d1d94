"""The values longrun's Slurm layer reads and returns, independent of any backend.

Every backend builds these and every caller reads them, so this module imports no backend: an
observation of a job (`JobState`, its `JobStatus` folded from Slurm's state names) or of a node
(`NodeState`), one step of a running job (`JobStep`), and what a command run as a step printed
(`CommandResult`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from training.records.schema import DRAIN_PREFIX


class JobStatus(StrEnum):
    """What a job is doing, in longrun's words (Slurm's state names folded; see `SLURM_STATES`)."""

    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    REQUEUED = "requeued"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    NODE_FAIL = "node_fail"
    PREEMPTED = "preempted"
    BOOT_FAIL = "boot_fail"
    OUT_OF_MEMORY = "out_of_memory"
    DEADLINE = "deadline"
    UNKNOWN = "unknown"


# Slurm base job state -> JobStatus. COMPLETING and CONFIGURING are not final: the exit code is not
# settled / the job has not started its script yet.
SLURM_STATES: dict[str, JobStatus] = {
    "PENDING": JobStatus.PENDING,
    "CONFIGURING": JobStatus.PENDING,
    "RESV_DEL_HOLD": JobStatus.PENDING,
    "RUNNING": JobStatus.RUNNING,
    "COMPLETING": JobStatus.RUNNING,
    "SIGNALING": JobStatus.RUNNING,
    "STAGE_OUT": JobStatus.RUNNING,
    "RESIZING": JobStatus.RUNNING,
    "SUSPENDED": JobStatus.SUSPENDED,
    "STOPPED": JobStatus.SUSPENDED,
    "REQUEUED": JobStatus.REQUEUED,
    "REQUEUE_HOLD": JobStatus.REQUEUED,
    "REQUEUE_FED": JobStatus.REQUEUED,
    "COMPLETED": JobStatus.COMPLETED,
    "FAILED": JobStatus.FAILED,
    "SPECIAL_EXIT": JobStatus.FAILED,
    "CANCELLED": JobStatus.CANCELLED,
    "REVOKED": JobStatus.CANCELLED,
    "TIMEOUT": JobStatus.TIMEOUT,
    "NODE_FAIL": JobStatus.NODE_FAIL,
    "PREEMPTED": JobStatus.PREEMPTED,
    "BOOT_FAIL": JobStatus.BOOT_FAIL,
    "OUT_OF_MEMORY": JobStatus.OUT_OF_MEMORY,
    "DEADLINE": JobStatus.DEADLINE,
}

ACTIVE = frozenset({JobStatus.PENDING, JobStatus.RUNNING, JobStatus.SUSPENDED, JobStatus.REQUEUED})


def fold_status(slurm_state: str, *, restart_count: int = 0) -> JobStatus:
    """JobStatus for a Slurm base state; a pending job that has run before is `requeued`."""
    status = SLURM_STATES.get(slurm_state.upper(), JobStatus.UNKNOWN)
    if status is JobStatus.PENDING and restart_count > 0:
        return JobStatus.REQUEUED
    return status


@dataclass(frozen=True, kw_only=True, slots=True)
class JobState:
    """One observation of a job."""

    job_id: int
    """Slurm job id."""
    status: JobStatus
    """longrun's reading of the state."""
    slurm_state: str
    """Slurm's base state, upper case (e.g. `NODE_FAIL`), as the source reported it."""
    exit_code: int | None = None
    """Exit code of the batch script once final (None while running or when killed by a signal)."""
    signal: int | None = None
    """Signal that ended the batch script, if any."""
    restart_count: int = 0
    """How often Slurm restarted (requeued) the job."""
    nodes: tuple[str, ...] = ()
    """Allocated nodes (the last allocation for a finished job), expanded."""
    reason: str | None = None
    """Slurm's state reason (`NonZeroExitCode`, `JobHeldAdmin`, ...), None when there is none."""
    name: str = ""
    """Job name."""
    comment: str = ""
    """Job comment (longrun's tag); empty where the source does not carry it (jobcomp)."""
    held: bool = False
    """The job is pending on hold (requeue-hold or `scontrol hold`)."""
    flags: tuple[str, ...] = ()
    """Extra state flags the source reported (23.02+ JSON lists them next to the base state)."""
    source: str = ""
    """Where the observation came from: squeue-json, scontrol, jobcomp, pyslurm."""

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE

    @property
    def is_terminal(self) -> bool:
        return self.status not in ACTIVE and self.status is not JobStatus.UNKNOWN

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "status": self.status.value,
            "slurm_state": self.slurm_state,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "restart_count": self.restart_count,
            "nodes": list(self.nodes),
            "reason": self.reason,
            "name": self.name,
            "comment": self.comment,
            "held": self.held,
            "flags": list(self.flags),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobState:
        return cls(
            job_id=int(d["job_id"]),
            status=JobStatus(d["status"]),
            slurm_state=str(d["slurm_state"]),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            restart_count=int(d.get("restart_count", 0)),
            nodes=tuple(d.get("nodes", ())),
            reason=d.get("reason"),
            name=str(d.get("name", "")),
            comment=str(d.get("comment", "")),
            held=bool(d.get("held", False)),
            flags=tuple(d.get("flags", ())),
            source=str(d.get("source", "")),
        )

    def describe(self) -> str:
        """One line for logs and failure messages: state, reason, exit code, nodes."""
        parts = [f"job {self.job_id} {self.slurm_state}"]
        if self.reason:
            parts.append(f"reason={self.reason}")
        if self.exit_code is not None:
            parts.append(f"exit_code={self.exit_code}")
        if self.signal:
            parts.append(f"signal={self.signal}")
        if self.restart_count:
            parts.append(f"restarts={self.restart_count}")
        if self.nodes:
            parts.append(f"nodes={','.join(self.nodes)}")
        return " ".join(parts)


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeState:
    """One observation of a node."""

    name: str
    """Node name."""
    state: str
    """Base state, lower case: idle, allocated, mixed, down, unknown, future, ..."""
    flags: frozenset[str] = field(default_factory=frozenset)
    """Upper-case flags: DRAIN, MAINTENANCE, RESERVED, NOT_RESPONDING, COMPLETING, ..."""
    reason: str | None = None
    """The reason an admin (or longrun) set, without Slurm's `[user@time]` suffix."""

    @property
    def drain_flag(self) -> bool:
        """Drained or draining: takes no new jobs (a running job keeps running)."""
        return "DRAIN" in self.flags or self.state in ("drained", "draining")

    @property
    def is_ours(self) -> bool:
        """The reason on the node carries longrun's prefix."""
        return bool(self.reason and self.reason.startswith(DRAIN_PREFIX))

    @property
    def is_down(self) -> bool:
        # Not NOT_RESPONDING alone: a node reads idle* for ~0.5 s after every resume.
        return self.state == "down"


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandResult:
    """What a command run through Slurm (srun) printed and how it ended."""

    exit_code: int
    """Exit code of the step (srun's own exit code)."""
    stdout: str
    """Captured standard output."""
    stderr: str
    """Captured standard error (srun's messages included)."""


class JobStep(NamedTuple):
    """One step of a running job, as `squeue --steps` lists it; unpacks as a `(step_id, name)` pair."""

    step_id: str
    """`<job id>.<step>`: `1234.0`, `1234.batch`, `1234.extern`."""
    name: str
    """The step's name (srun's `--job-name`; `batch`, `extern` for Slurm's own steps); "" when unnamed."""
