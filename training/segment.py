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
from dataclasses import dataclass

from training.records.base import FIELDS_HERE, Declared
from training.records.fields import Field, at_least, matches, one_of, opt_float, opt_int, opt_str, opt_strs
from training.records.schema import SchemaError

SEGMENT_SCHEMA_VERSION = 1
FAULT_SCHEMA_VERSION = 1
SEGMENTS_DIR = "segments/"
FAULTS_DIR = "faults/"
#: How a segment ended (None while it runs).
SEGMENT_EXITS = ("done", "sdc_verdict", "error")

_IDENT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment(Declared):
    """One incarnation of the trainer, as rank 0 saw it."""

    KIND = "segment"
    VERSION = SEGMENT_SCHEMA_VERSION
    FIELDS = {
        "run": Field(opt_str),
        "segment_id": Field(opt_str, checks=(matches(_IDENT, "is not a plain identifier"),)),
        "job_id": Field(opt_str, need=False),
        "restart_count": Field(opt_int),
        "start_step": Field(opt_int, checks=(at_least(0),)),
        "resumed_from": Field(opt_str, need=False),
        "started_at": Field(opt_float),
        "world_size": Field(opt_int),
        "nodes": Field(opt_strs),
        "first_step": Field(opt_int, need=False),
        "first_healthy_step": Field(opt_int, need=False),
        "first_healthy_time": Field(opt_float, need=False),
        "last_step": Field(opt_int, need=False),
        "ended_at": Field(opt_float, need=False),
        "exit": Field(opt_str, need=False, checks=(one_of(SEGMENT_EXITS),)),
    }
    ORDER = (FIELDS_HERE, "schema_version", "kind")

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

    def _settle(self) -> None:
        if self.first_step is not None and self.first_step <= self.start_step:
            raise SchemaError(
                f"{self.KIND} record field 'first_step' = {self.first_step} is not after start_step"
                f" {self.start_step}"
            )
        object.__setattr__(self, "nodes", tuple(self.nodes))

    @property
    def relative_path(self) -> str:
        return f"{SEGMENTS_DIR}{self.segment_id}.json"


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
class FaultFired(Declared):
    """A drill's fault, injected (written just before the injection)."""

    KIND = "fault"
    VERSION = FAULT_SCHEMA_VERSION
    FIELDS = {
        "run": Field(opt_str),
        "fault": Field(opt_str),
        "step": Field(opt_int, checks=(at_least(1),)),
        "rank": Field(opt_int, checks=(at_least(0),)),
        "node": Field(opt_str),
        "time": Field(opt_float),
        "spec": Field(opt_str),
    }
    ORDER = (FIELDS_HERE, "schema_version", "kind")

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

    @property
    def relative_path(self) -> str:
        # The injection time is in the name: an NVRx in-job restart that replays the step fires the fault
        # again, and overwriting the first record would move the injection after the alert it caused.
        return f"{FAULTS_DIR}{self.step:08d}-{self.fault}-r{self.rank:03d}-{int(self.time * 1000)}.json"
