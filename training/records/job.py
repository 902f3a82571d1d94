"""The records the job writes about its own run: check, progress, manifest, save, report (the alert is in
training/records/alert.py). Field meanings are in docs/contracts.md; `extra` keeps what a newer writer added."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from training.records.alert import World
from training.records.base import Record
from training.records.fields import (
    ints_of,
    opt_bool,
    opt_dict,
    opt_float,
    opt_int,
    opt_objects,
    opt_str,
    schema_fields,
    strs_of,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckRecord(Record):
    """One check's result on one rank at one step (passes too)."""

    KIND = "check"
    run: str
    step: int
    check: str
    verdict: str
    """`pass`, `fail` or `skip`."""
    rank: int
    duration_s: float
    loss: float | None = None
    """The step's mean loss (the run-health loss curve)."""
    world_size: int | None = None
    """Ranks of the step's world, as the writing rank saw it (None: the record does not say)."""
    suspect_ranks: tuple[int, ...] = ()
    suspect_nodes: tuple[str, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)
    FIELDS = schema_fields(
        KIND,
        loss=opt_float,
        world_size=opt_int,
        suspect_ranks=ints_of,
        suspect_nodes=strs_of,
        evidence=opt_dict,
    )

    @property
    def fingerprints_by_rank(self) -> dict[str, Any]:
        """A weight vote's fingerprint of every replica, when its evidence lists them (failures do)."""
        by_rank = self.evidence.get("fingerprints_by_rank")
        return dict(by_rank) if isinstance(by_rank, Mapping) else {}

    @property
    def replicas(self) -> int | None:
        """The replicas a weight vote counted, when its evidence says (a non-zero integer), else None."""
        n = self.evidence.get("replicas")
        return n if isinstance(n, int) and not isinstance(n, bool) and n else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress(Record):
    """The heartbeat: the latest step, its loss and time."""

    KIND = "progress"
    run: str
    step: int
    loss: float | None
    step_time_s: float
    time: float
    total_steps: int | None = None
    world_size: int | None = None
    restart_count: int | None = None
    FIELDS = schema_fields(KIND, total_steps=opt_int, world_size=opt_int, restart_count=opt_int)


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest(Record):
    """A checkpoint's manifest, written last: no manifest, no checkpoint."""

    KIND = "manifest"
    run: str
    step: int
    time: float
    files: tuple[Mapping[str, Any], ...]
    """One object per payload file: `name`, `sha256`, `size`."""
    fingerprints: Mapping[str, Any]
    weight_vote: Mapping[str, Any]
    """The weight vote at save time (`verdict`, `ranks`, `votes`)."""
    coverage: Mapping[str, Any]
    """The last passing audit at or before the save."""
    loss: float | None
    code_version: str
    world: World
    FIELDS = schema_fields(KIND, files=opt_objects, world=lambda kind, obj, name: World.from_json(obj[name]))


@dataclass(frozen=True, slots=True, kw_only=True)
class FileEntry:
    """What a reader that must not fail (the audit) takes from one entry of a manifest's `files`: each
    field of the right type, or None."""

    name: str | None = None
    """The file's name in the checkpoint's folder."""
    key: str | None = None
    """The file's store key, where the writer gave one instead of a name."""
    sha256: str | None = None
    size: int | None = None

    @classmethod
    def shown(cls, obj: Any) -> Self:
        """Never raises: an entry that is not an object, or a field that is not of its type, reads as
        empty."""
        if not isinstance(obj, Mapping):
            return cls()
        name, key, sha, size = obj.get("name"), obj.get("key"), obj.get("sha256"), obj.get("size")
        return cls(
            name=name if isinstance(name, str) else None,
            key=key if isinstance(key, str) else None,
            sha256=sha if isinstance(sha, str) else None,
            size=size if isinstance(size, int) and not isinstance(size, bool) else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Save(Record):
    """The outcome of one background checkpoint save (failures too)."""

    KIND = "save"
    run: str
    step: int
    ok: bool
    error: str | None
    time: float
    job_id: str | None = None
    """The saver's id of the save (the result it waits for carries it back)."""
    uploaded: bool | None = None
    """The manifest reached the store."""
    nbytes: int | None = None
    writer: str | None = None
    """`nvrx` or `thread`: where the upload stage ran."""
    duration_s: float | None = None
    FIELDS = schema_fields(
        KIND, job_id=opt_str, uploaded=opt_bool, nbytes=opt_int, writer=opt_str, duration_s=opt_float
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Report(Record):
    """The run report, written once at the end: `final_fingerprint` compares two runs."""

    KIND = "report"
    run: str
    final_step: int
    final_fingerprint: str
    time: float
    total_steps: int | None = None
    FIELDS = schema_fields(KIND, total_steps=opt_int)

    @property
    def orchestrator(self) -> ReportOrchestrator:
        """The section the orchestrator adds at the run's end (`orchestrator`), read tolerantly."""
        return ReportOrchestrator.from_json(self.extra.get("orchestrator"))


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportOrchestrator:
    """What a reader that must not fail takes from a run report's `orchestrator` section (written by
    longrun.monitor.lifecycle.finish, absent before the run ended): each list as written, or empty."""

    promoted_steps: tuple[Any, ...] = ()
    segments: tuple[Any, ...] = ()
    """One object per incarnation of the trainer, in order (longrun.monitor.segments.segment_table)."""

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        """Never raises: a section that is absent or not an object, or a field that is not a list, reads
        as empty."""
        if not isinstance(obj, Mapping):
            return cls()
        promoted, segments = obj.get("promoted_steps"), obj.get("segments")
        return cls(
            promoted_steps=tuple(promoted) if isinstance(promoted, list | tuple) else (),
            segments=tuple(segments) if isinstance(segments, list | tuple) else (),
        )


__all__ = ["CheckRecord", "FileEntry", "Manifest", "Progress", "Report", "ReportOrchestrator", "Save"]
