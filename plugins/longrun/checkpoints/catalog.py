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
from typing import Any, TypeVar

from training.checkpoint.manifest import CheckpointError, read_manifest
from training.records import schema
from training.records.alert import Alert
from training.records.base import Record
from training.records.job import CheckRecord, Manifest
from training.records.orchestrator import Incident, Promotion, SuspectMark, Validation
from training.store.interface import NotFound, ObjectStore
from training.store.update import UpdateConflict, read_versioned

_STEP_DIR = re.compile(r"checkpoints/step-(\d{8})/([^/]+)$")
R = TypeVar("R", bound=Record)


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
    record: Any = None
    """The decoded JSON of a record that did not read as its type (None: it did not decode)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    """The checkpoints of a run, and what was found wrong while reading them."""

    checkpoints: tuple[Checkpoint, ...]
    """Checkpoints with a parsable manifest, by step."""
    problems: tuple[Problem, ...]
    """Unparsable manifests and incomplete checkpoint directories."""

    def by_step(self) -> dict[int, Checkpoint]:
        return {c.step: c for c in self.checkpoints}


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


def _typed(
    store: ObjectStore, run: str, relative_dir: str, cls: type[R], problems: list[Problem] | None
) -> list[tuple[str, R]]:
    """(key, record) for every `cls` record under the run's `relative_dir`, in listing order.

    A record that does not read (not JSON, refused by the table or by its type) raises a ValueError
    naming its key: the readers that act on these records (promotion, pick, retention) never skip one.
    With `problems` given, it is listed there instead (for readers that only show). A record deleted
    while listing is no record."""
    out = []
    prefix = schema.store_key(run, relative_dir)
    folder = prefix.rsplit("/", 1)[0] + "/"
    for info in store.list(prefix):
        if not info.key.endswith(".json") or "/" in info.key[len(folder) :]:
            continue  # an attachment in a subfolder (an incident's plots) is no record
        try:
            data = store.get_bytes(info.key)
        except NotFound:
            continue
        obj: Any = None
        try:
            obj = json.loads(data)
            out.append((info.key, cls.from_json(obj)))
        except (ValueError, UnicodeDecodeError) as e:
            if problems is None:
                raise schema.SchemaError(f"{info.key}: not a {cls.KIND} record ({e})") from e
            problems.append(Problem(key=info.key, error=f"not a {cls.KIND} record: {e}", record=obj))
    return out


def validations(
    store: ObjectStore, run: str, step: int | None = None, *, problems: list[Problem] | None = None
) -> list[tuple[str, Validation]]:
    """(key, validation) of `step` (or all), oldest first. One that does not read raises a ValueError
    naming its key (see `_typed`; `problems`: list it there instead)."""
    sub = f"validations/step-{step:08d}-" if step is not None else "validations/"
    found = _typed(store, run, sub, Validation, problems)
    return sorted(found, key=lambda kv: (kv[1].step, kv[1].time))


def latest_validation(store: ObjectStore, run: str, step: int) -> tuple[str, Validation] | None:
    """(key, newest validation) of checkpoint `step`, or None before its first validation. A validation
    of `step` that does not read raises a ValueError naming its key: it may be the newest, and skipping
    it could let an older passing one enable a promotion."""
    recs = validations(store, run, step)
    for key, v in recs:
        if v.step != step:
            raise schema.SchemaError(f"{key}: a validation of step {v.step} under the key of step {step}")
    return recs[-1] if recs else None


def promotion_history(
    store: ObjectStore, run: str, *, problems: list[Problem] | None = None
) -> list[Promotion]:
    """Promotion records in order of their sequence number. One that does not read raises a ValueError
    naming its key (`problems`: list it there instead): retention must not delete the checkpoint an
    unreadable entry may name."""
    recs = [rec for _key, rec in _typed(store, run, "promoted/history/", Promotion, problems)]
    return sorted(recs, key=lambda r: r.seq)


def current_pointer(store: ObjectStore, run: str) -> tuple[Promotion, str] | None:
    """(pointer record, its ETag), or None before the first promotion. The ETag is that of the bytes
    read (training.store.update.read_versioned), so a caller's If-Match means what it read. A pointer
    that does not read raises a ValueError."""
    key = schema.store_key(run, schema.PROMOTED_POINTER_PATH)
    try:
        cur = read_versioned(store, key, what="promotion pointer")
    except UpdateConflict:
        raise RuntimeError(f"{key} kept changing while being read in {store.describe()}") from None
    return None if cur is None else (Promotion.from_json(cur.value), cur.etag)


def promoted_steps(store: ObjectStore, run: str) -> list[int]:
    """Steps ever promoted (the step index or the history, plus the current pointer), ascending, without
    repeats. Where the pointer says the step index is complete (`steps_indexed`), one listing of
    `promoted/steps/` (keys only, as the checkpoint list is read) instead of one get per promotion;
    else the history, where an entry that does not read is left out (a pick or a demotion then has one
    candidate fewer). The index lives on the orchestrator's side of the store, beside the pointer."""
    cur = current_pointer(store, run)
    if cur is not None and cur[0].steps_indexed:
        listed = store.list(schema.store_key(run, schema.PROMOTED_STEPS_DIR))
        steps = {s for o in listed if (s := schema.step_of_promoted_key(o.key)) is not None}
    else:
        steps = {r.step for r in promotion_history(store, run, problems=[])}
    if cur is not None:
        steps.add(cur[0].step)
    return sorted(steps)


def suspect_marks(store: ObjectStore, run: str) -> list[SuspectMark]:
    """The run's suspect marks, by `after_step`. A mark that does not read (not JSON, or not a
    `SuspectMark`) raises a ValueError naming its key: a mark is never skipped, since skipping one could
    let a suspect checkpoint be picked or promoted."""
    marks = [mark for _key, mark in _typed(store, run, "suspect/", SuspectMark, None)]
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


@dataclass(frozen=True, slots=True)
class CheckBatch:
    """A check batch's key, and what the key says it holds (schema.parse_check_batch_path)."""

    key: str
    first: int
    last: int
    rank: int


def _batches(store: ObjectStore, prefix: str) -> list[CheckBatch]:
    out = []
    for info in store.list(prefix):
        parsed = schema.parse_check_batch_path(info.key)
        if parsed is not None:  # another name, or a span past the bound: no evidence
            out.append(CheckBatch(info.key, *parsed))
    return out


def check_batches(store: ObjectStore, run: str) -> list[CheckBatch]:
    """Every check batch of the run, in key order (one listing of the whole checks/ prefix)."""
    return _batches(store, schema.store_key(run, "checks/"))


def check_batches_in_window(store: ObjectStore, run: str, window_start: int) -> list[CheckBatch]:
    """The batches whose first step lies in [window_start, window_start + schema.CHECK_BATCH_WINDOW):
    one listing of their key prefix, whatever the age of the run."""
    if window_start % schema.CHECK_BATCH_WINDOW:
        raise ValueError(f"window start {window_start} is not a multiple of {schema.CHECK_BATCH_WINDOW}")
    return _batches(store, schema.store_key(run, schema.check_batch_window_prefix(window_start)))


def read_check_batch(
    store: ObjectStore, batch: CheckBatch, *, problems: list[str] | None = None
) -> list[CheckRecord]:
    """The batch's records that read and are its key's rank's, within the steps its key names. A bad line,
    or a record of another rank or outside its key's steps, is no evidence: skipped (a pass it might have
    held is then missing, which can only lower the pick's bound), and named in `problems` when given (the
    run-health page shows them). A batch gone since the listing holds nothing."""
    try:
        text = store.get_bytes(batch.key).decode("utf-8", "replace")
    except NotFound:
        return []
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = CheckRecord.from_json(json.loads(line))
        except ValueError as e:
            if problems is not None:
                problems.append(f"{batch.key}:{n}: not a check record ({e})")
            continue
        if rec.rank == batch.rank and batch.first <= rec.step <= batch.last:
            out.append(rec)
        elif problems is not None:
            problems.append(f"{batch.key}:{n}: holds rank {rec.rank} step {rec.step}, not its key's")
    return out


def check_records(store: ObjectStore, run: str) -> Iterator[CheckRecord]:
    """Every check record of the run that is evidence (`read_check_batch`), batch by batch in key order.
    Reads every batch: the pick reads only those near its alert (longrun.checkpoints.pick)."""
    for batch in check_batches(store, run):
        yield from read_check_batch(store, batch)


def alerts(store: ObjectStore, run: str) -> list[tuple[str, Alert]]:
    """(key, alert), oldest step first. An alert that does not read raises a ValueError naming its key
    (the newest alert decides what `longrun checkpoints pick` picks for)."""
    found = _typed(store, run, "alerts/", Alert, None)
    return sorted(found, key=lambda ka: (ka[1].step, ka[1].time))


def incidents(
    store: ObjectStore, run: str, *, problems: list[Problem] | None = None
) -> list[tuple[str, Incident]]:
    """(key, incident) of the run. One that does not read raises a ValueError naming its key, unless
    `problems` is given: then it is listed there with its decoded JSON (retention holds checkpoints for
    it, as for an open incident)."""
    return _typed(store, run, "incidents/", Incident, problems)
