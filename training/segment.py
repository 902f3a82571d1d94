"""Where each attempt started and what a drill really did: the proof-of-resume records.

A *segment* is one incarnation of the trainer: a launch (Slurm job, job step) and, inside it, each NVRx
in-job restart. Rank 0 writes its record three times: when it starts (`start_step`, `resumed_from`),
at its first healthy step (a step whose checks all passed), and when it ends (`last_step`, `exit`).
Lost steps are read from these records (the previous segment's `last_step` minus the next one's
`start_step`), never computed from the alert and the pick.

A *fault record* is written by the rank that injects a drill's fault, right before it does so (a crash
drill kills the process next): a drill whose fault never fired leaves none, and the orchestrator fails
the run naming the drill instead of reporting a clean success.

Pure Python (no torch, no Airflow): the orchestrator reads both kinds with the same classes.

    segments/<job>.<job step>-r<restart>.json     one per segment (rewritten as it progresses)
    faults/<step>-<kind>-r<rank>.json             one per injected fault and rank
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from training.records.fields import need, opt_float, opt_int, opt_str, opt_strs, stamped

SEGMENT_SCHEMA_VERSION = 1
FAULT_SCHEMA_VERSION = 1
SEGMENTS_DIR = "segments/"
FAULTS_DIR = "faults/"
#: How a segment ended (None while it runs).
SEGMENT_EXITS = ("done", "sdc_verdict", "error")

_IDENT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    """One incarnation of the trainer, as rank 0 saw it."""

    run: str
    """Run name."""
    segment_id: str
    """`<job id>.<job step>-r<restart>` (see `segment_id`); also the record's file stem."""
    job_id: str | None
    """Slurm job id (None outside Slurm)."""
    restart_count: int
    """NVRx in-job restart number of this incarnation (0: the launch itself)."""
    start_step: int
    """The last step already in the weights when training began (0: from scratch)."""
    resumed_from: str | None
    """The checkpoint loaded (a store prefix or a directory), None when starting from scratch."""
    started_at: float
    """Wall time (epoch s) when the model was ready and the first step began."""
    world_size: int
    """Ranks of this incarnation."""
    nodes: tuple[str, ...]
    """Node of each rank."""
    first_step: int | None = None
    """The first step this incarnation trained (start_step + 1, as the loop really ran it)."""
    first_healthy_step: int | None = None
    """The first step whose checks all passed and whose update was applied."""
    first_healthy_time: float | None = None
    """Wall time when that step completed: "training again" for the time to recover."""
    last_step: int | None = None
    """The last step the loop ran (the failing one included), when the segment ended."""
    ended_at: float | None = None
    """Wall time of the end."""
    exit: str | None = None
    """One of SEGMENT_EXITS once ended."""
    schema_version: int = SEGMENT_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not _IDENT.match(self.segment_id):
            raise ValueError(f"field 'segment_id' = {self.segment_id!r} is not a plain identifier")
        if self.start_step < 0:
            raise ValueError(f"field 'start_step' = {self.start_step!r} must be >= 0")
        if self.exit is not None and self.exit not in SEGMENT_EXITS:
            raise ValueError(f"field 'exit' = {self.exit!r}; expected one of {SEGMENT_EXITS}")
        if self.first_step is not None and self.first_step <= self.start_step:
            raise ValueError(
                f"field 'first_step' = {self.first_step} is not after start_step {self.start_step}"
            )
        object.__setattr__(self, "nodes", tuple(self.nodes))

    @property
    def relative_path(self) -> str:
        return f"{SEGMENTS_DIR}{self.segment_id}.json"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["nodes"] = list(self.nodes)
        out["kind"] = "segment"
        return out

    @classmethod
    def from_json(cls, raw: str | bytes | dict[str, Any]) -> Segment:
        kind = "segment"
        obj = stamped(kind, raw, SEGMENT_SCHEMA_VERSION)
        return cls(
            run=need(kind, obj, "run", opt_str),
            segment_id=need(kind, obj, "segment_id", opt_str),
            job_id=opt_str(kind, obj, "job_id"),
            restart_count=need(kind, obj, "restart_count", opt_int),
            start_step=need(kind, obj, "start_step", opt_int),
            resumed_from=opt_str(kind, obj, "resumed_from"),
            started_at=need(kind, obj, "started_at", opt_float),
            world_size=need(kind, obj, "world_size", opt_int),
            nodes=need(kind, obj, "nodes", opt_strs),
            first_step=opt_int(kind, obj, "first_step"),
            first_healthy_step=opt_int(kind, obj, "first_healthy_step"),
            first_healthy_time=opt_float(kind, obj, "first_healthy_time"),
            last_step=opt_int(kind, obj, "last_step"),
            ended_at=opt_float(kind, obj, "ended_at"),
            exit=opt_str(kind, obj, "exit"),
            schema_version=obj["schema_version"],
        )


def segment_id(*, job_id: str | None, job_step: str | None, restart_count: int, started_at: float) -> str:
    """`<job>.<step>-r<restart>`; outside Slurm `local<start time>` stands in for the job."""
    return f"{job_id or f'local{int(started_at)}'}.{job_step or '0'}-r{restart_count}"


def ordered(segments: list[Segment]) -> list[Segment]:
    """Segments in the order they ran."""
    return sorted(segments, key=lambda s: (s.started_at, s.segment_id))


def lost_steps(before: Segment, after: Segment) -> int | None:
    """Steps trained again after the switch from `before` to `after`, read from the two records."""
    if before.last_step is None:
        return None
    return max(0, before.last_step - after.start_step)


def last_trained(segs: list[Segment]) -> Segment | None:
    """The latest of `segs` (in run order) that trained a step: the one whose weights a relaunch replaces.
    An incarnation that trained nothing (an NVRx in-job restart after the launch's SDC verdict exits 93
    before its first step) has no say in what was lost."""
    trained = [s for s in segs if s.last_step is not None]
    return trained[-1] if trained else None


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultFired:
    """A drill's fault, injected (written just before the injection)."""

    run: str
    """Run name."""
    fault: str
    """Fault kind (training.records.schema.FAULT_KINDS)."""
    step: int
    """Step at which it fired."""
    rank: int
    """Rank that injected it."""
    node: str
    """Node of that rank."""
    time: float
    """Wall time of the injection."""
    spec: str
    """The drill's `KIND:STEP:TARGET`."""
    schema_version: int = FAULT_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.step < 1:
            raise ValueError(f"field 'step' = {self.step!r} must be >= 1")
        if self.rank < 0:
            raise ValueError(f"field 'rank' = {self.rank!r} must be >= 0")

    @property
    def relative_path(self) -> str:
        # The injection time is in the name: an NVRx in-job restart that replays the step fires the fault
        # again, and overwriting the first record would move the injection after the alert it caused.
        return f"{FAULTS_DIR}{self.step:08d}-{self.fault}-r{self.rank:03d}-{int(self.time * 1000)}.json"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kind": "fault"}

    @classmethod
    def from_json(cls, raw: str | bytes | dict[str, Any]) -> FaultFired:
        kind = "fault"
        obj = stamped(kind, raw, FAULT_SCHEMA_VERSION)
        return cls(
            run=need(kind, obj, "run", opt_str),
            fault=need(kind, obj, "fault", opt_str),
            step=need(kind, obj, "step", opt_int),
            rank=need(kind, obj, "rank", opt_int),
            node=need(kind, obj, "node", opt_str),
            time=need(kind, obj, "time", opt_float),
            spec=need(kind, obj, "spec", opt_str),
            schema_version=obj["schema_version"],
        )
