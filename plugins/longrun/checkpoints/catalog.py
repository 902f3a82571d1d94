"""What the store holds for a run: checkpoints (by manifest), validations, promotions, suspect marks,
check records and alerts. Read-only.

A manifest that does not parse is reported (as a `Problem`) and ignored; a checkpoint directory without
a manifest is reported as incomplete and is never a checkpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from training import schema
from training.manifest import CheckpointError, read_manifest
from training.records import Manifest, SuspectMark
from training.store import NotFound, ObjectStore

_STEP_DIR = re.compile(r"checkpoints/step-(\d{8})/([^/]+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A checkpoint whose manifest parsed."""

    step: int
    """Training step."""
    manifest_key: str
    """Store key of its manifest."""
    manifest: Manifest
    """The parsed manifest."""

    @property
    def prefix(self) -> str:
        """Store key prefix of the checkpoint directory (what `load_checkpoint` takes)."""
        return self.manifest_key.rsplit("/", 1)[0] + "/"


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """Something in the store that is not usable, and why."""

    key: str
    """Store key (or prefix) concerned."""
    error: str
    """What is wrong."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    """The checkpoints of a run, and what was found wrong while reading them."""

    checkpoints: tuple[Checkpoint, ...]
    """Checkpoints with a parsable manifest, by step."""
    problems: tuple[Problem, ...]
    """Unparsable manifests and incomplete checkpoint directories."""

    def by_step(self) -> dict[int, Checkpoint]:
        return {c.step: c for c in self.checkpoints}


def _get_json(store: ObjectStore, key: str) -> Any:
    return json.loads(store.get_bytes(key))


def checkpoints(store: ObjectStore, run: str) -> Catalog:
    """Every checkpoint of `run` in the store (one listing), with the problems found."""
    prefix = schema.run_prefix(run)
    dirs: dict[int, set[str]] = {}
    for info in store.list(prefix + "checkpoints/"):
        m = _STEP_DIR.search(info.key[len(prefix) :])
        if m:
            dirs.setdefault(int(m.group(1)), set()).add(m.group(2))
    found: list[Checkpoint] = []
    problems: list[Problem] = []
    for step in sorted(dirs):
        key = schema.store_key(run, schema.manifest_path(step))
        if "manifest.json" not in dirs[step]:
            problems.append(
                Problem(
                    key=key.rsplit("/", 1)[0] + "/", error="incomplete: no manifest.json, not a checkpoint"
                )
            )
            continue
        try:
            manifest = Manifest.from_json(read_manifest(store.get_bytes(key), key))
        except NotFound:
            problems.append(Problem(key=key, error="manifest vanished while listing"))
            continue
        except CheckpointError as e:
            problems.append(Problem(key=key, error=str(e)))
            continue
        except ValueError as e:
            problems.append(Problem(key=key, error=f"manifest {key} does not read: {e}"))
            continue
        if manifest.step != step or manifest.run != run:
            problems.append(
                Problem(
                    key=key,
                    error=f"manifest says run {manifest.run!r} step {manifest.step}, "
                    f"its key says run {run!r} step {step}",
                )
            )
            continue
        found.append(Checkpoint(step=step, manifest_key=key, manifest=manifest))
    return Catalog(checkpoints=tuple(found), problems=tuple(problems))


def _records(
    store: ObjectStore, run: str, relative_dir: str, kind: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(key, record) for every parsable record of `kind` under the run's `relative_dir`; others skipped."""
    for info in store.list(schema.store_key(run, relative_dir)):
        if not info.key.endswith(".json"):
            continue
        try:
            rec = _get_json(store, info.key)
            schema.validate(kind, rec)
        except (NotFound, ValueError):
            continue
        yield info.key, rec


def validations(store: ObjectStore, run: str, step: int | None = None) -> list[dict[str, Any]]:
    """Validation records (of `step`, or all), oldest first; each gains `_key`."""
    sub = f"validations/step-{step:08d}-" if step is not None else "validations/"
    out = [{**rec, "_key": key} for key, rec in _records(store, run, sub, "validation")]
    return sorted(out, key=lambda r: (r["step"], r["time"]))


def latest_validation(store: ObjectStore, run: str, step: int) -> dict[str, Any] | None:
    recs = [r for r in validations(store, run, step) if r["step"] == step]
    return recs[-1] if recs else None


def promotion_history(store: ObjectStore, run: str) -> list[dict[str, Any]]:
    """Promotion records in order of their sequence number."""
    recs = [rec for _key, rec in _records(store, run, "promoted/history/", "promotion")]
    return sorted(recs, key=lambda r: r["seq"])


def current_pointer(store: ObjectStore, run: str) -> tuple[dict[str, Any], str] | None:
    """(pointer record, its ETag), or None before the first promotion."""
    key = schema.store_key(run, schema.PROMOTED_POINTER_PATH)
    for _ in range(8):
        info = store.head(key)
        if info is None:
            return None
        try:
            data = store.get_bytes(key)
        except NotFound:
            continue
        # The ETag must be that of the bytes we read, so a caller's If-Match means what it read.
        again = store.head(key)
        if again is not None and again.etag == info.etag:
            rec = json.loads(data)
            schema.validate("promotion", rec)
            return rec, info.etag
    raise RuntimeError(f"{key} kept changing while being read in {store.describe()}")


def promoted_steps(store: ObjectStore, run: str) -> list[int]:
    """Steps ever promoted (history plus the current pointer), ascending, without repeats."""
    steps = {r["step"] for r in promotion_history(store, run)}
    cur = current_pointer(store, run)
    if cur is not None:
        steps.add(cur[0]["step"])
    return sorted(steps)


def suspect_marks(store: ObjectStore, run: str) -> list[SuspectMark]:
    """The run's suspect marks, by `after_step`. A mark that the table accepts but that does not read as a
    `SuspectMark` raises a ValueError naming its key: a mark is never skipped, since skipping one could let
    a suspect checkpoint be picked or promoted."""
    marks = []
    for key, rec in _records(store, run, "suspect/", "suspect"):
        try:
            marks.append(SuspectMark.from_json(rec))
        except ValueError as e:
            raise ValueError(f"{key}: not a suspect mark ({e})") from e
    return sorted(marks, key=lambda m: m.after_step)


def suspect_after(store: ObjectStore, run: str) -> int | None:
    """Checkpoints with a step above this are suspect (the lowest `after_step` of all marks), or None."""
    marks = suspect_marks(store, run)
    return min(m.after_step for m in marks) if marks else None


def is_suspect(step: int, after: int | None) -> bool:
    return after is not None and step > after


def suspect_mark_for(store: ObjectStore, run: str, step: int, saved_at: float | None) -> SuspectMark | None:
    """The suspect mark that demotes checkpoint `step` saved at `saved_at`, or None.

    A mark demotes the checkpoints after its last known-good step that were saved BEFORE the mark: the
    relaunch that follows an incident saves later steps again from a clean checkpoint, and those are not
    suspect (the rule the UI and the audit apply too). `saved_at` None: by step alone."""
    return demoting_mark(suspect_marks(store, run), step, saved_at)


def demoting_mark(marks: Sequence[SuspectMark], step: int, saved_at: float | None) -> SuspectMark | None:
    """Pure form of `suspect_mark_for` over marks already read (the rule is `SuspectMark.demotes`)."""
    return next((m for m in marks if m.demotes(step, saved_at)), None)


def saved_at(store: ObjectStore, run: str, step: int) -> float | None:
    """The manifest time of checkpoint `step`, or None when its manifest is missing or unreadable."""
    key = schema.store_key(run, schema.manifest_path(step))
    try:
        return float(read_manifest(store.get_bytes(key), key)["time"])
    except (NotFound, CheckpointError):
        return None


def check_records(store: ObjectStore, run: str) -> Iterator[dict[str, Any]]:
    """Every parsable check record under the run's checks/*.jsonl (bad lines are skipped)."""
    for info in store.list(schema.store_key(run, "checks/")):
        if not info.key.endswith(".jsonl"):
            continue
        try:
            text = store.get_bytes(info.key).decode("utf-8", "replace")
        except NotFound:
            continue
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                schema.validate("check", rec)
            except ValueError:
                continue
            yield rec


def alerts(store: ObjectStore, run: str) -> list[tuple[str, dict[str, Any]]]:
    """(key, alert record), oldest step first."""
    return sorted(_records(store, run, "alerts/", "alert"), key=lambda kr: (kr[1]["step"], kr[1]["time"]))


def incidents(store: ObjectStore, run: str) -> list[dict[str, Any]]:
    return [rec for _key, rec in _records(store, run, "incidents/", "incident")]
