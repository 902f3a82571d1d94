"""Promotion (the pointer `promoted/current.json`) and demotion (suspect marks).

The pointer is only ever written with a conditional write: `If-None-Match: *` for the first promotion,
`If-Match: <ETag read>` after (training.store.update), so of two writers racing from the same state
exactly one wins and the other gets `PromotionConflict` (or, where it retries, decides again on the
winner's pointer); a reader sees the old or the new pointer, never a mix. Every promotion is
also kept under `promoted/history/<seq>.json`, and each promoted step under `promoted/steps/<step>.json`
(both written after the pointer; a missing one is filled in by the next promotion from the pointer it
replaces). The step index lets a reader list the promoted steps (`catalog.promoted_steps`) instead of
reading one history entry per promotion, which grew with the age of the run; the pointer's
`steps_indexed` says the index is complete (a run promoted before the index gets it backfilled once, at
its next promotion).

Promotion is refused for a checkpoint that is not validated (its newest validation record must pass and
be of the manifest as it is now) or that is suspect.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from longrun.checkpoints import catalog
from training.checkpoint.manifest import CheckpointError, read_manifest
from training.records import schema
from training.records.job import Manifest
from training.records.orchestrator import Promotion, SuspectMark, Validation
from training.store.interface import ObjectStore, PreconditionFailed, dump_json
from training.store.update import UpdateConflict, create_once, put_if_unchanged, update_json

POINTER_ATTEMPTS = 8


class PromotionRefused(Exception):
    """The checkpoint may not be promoted; the message says why."""


class PromotionConflict(Exception):
    """Another writer changed the pointer between our read and our write; nothing was written."""


def _history_key(run: str, seq: int) -> str:
    return schema.store_key(run, schema.promotion_history_path(seq))


def _pointer_key(run: str) -> str:
    return schema.store_key(run, schema.PROMOTED_POINTER_PATH)


def _put_history(store: ObjectStore, run: str, rec: dict[str, Any]) -> None:
    # once each: else already recorded (a retry, or a backfill by the next promotion); the step's entry
    # keeps its first promotion
    create_once(store, _history_key(run, rec["seq"]), dump_json(rec))
    create_once(store, schema.store_key(run, schema.promoted_step_path(rec["step"])), dump_json(rec))


def check_promotable(store: ObjectStore, run: str, step: int) -> tuple[str, tuple[str, Validation]]:
    """(manifest key, (key, newest validation)) if `step` may be promoted, else PromotionRefused. A
    validation of `step` that does not read refuses (it may be the newest), naming its key."""
    manifest_key = schema.store_key(run, schema.manifest_path(step))
    info = store.head(manifest_key)
    if info is None:
        raise PromotionRefused(f"step {step} of run {run}: no manifest at {manifest_key}, not a checkpoint")
    try:
        manifest = Manifest.from_json(read_manifest(store.get_bytes(manifest_key), manifest_key))
    except (CheckpointError, ValueError) as e:
        raise PromotionRefused(f"step {step} of run {run}: {e}") from None
    try:
        latest = catalog.latest_validation(store, run, step)
    except ValueError as e:
        raise PromotionRefused(f"step {step} of run {run}: a validation does not read: {e}") from None
    if latest is None:
        raise PromotionRefused(
            f"step {step} of run {run} is not validated: run `longrun checkpoints validate --run {run} --step {step}`"
        )
    v = latest[1]
    if not v.ok:
        raise PromotionRefused(
            f"step {step} of run {run} failed its latest validation: {'; '.join(v.errors[:3])}"
        )
    if v.manifest_etag != info.etag:
        raise PromotionRefused(
            f"step {step} of run {run}: the manifest changed since it was validated; validate again"
        )
    try:
        mark = catalog.suspect_mark_for(store, run, step, manifest.time)
    except ValueError as e:
        raise PromotionRefused(f"step {step} of run {run}: a suspect mark does not read: {e}") from None
    if mark is not None:
        raise PromotionRefused(
            f"step {step} of run {run} is suspect (checkpoints after step {mark.after_step} saved before"
            f" the mark are demoted)"
        )
    return manifest_key, latest


def promote(
    store: ObjectStore, run: str, step: int, *, by: str = "longrun", attempts: int = 1
) -> dict[str, Any]:
    """Point `promoted/current.json` at checkpoint `step`; returns the promotion record. Promoting the
    step the pointer already names returns the current record and writes nothing.

    `attempts`: tries when another writer moves the pointer between our read and our write; each try
    checks `step` again against the pointer and records as they are then (a demotion may have won).
    After the last lost try, PromotionConflict; PromotionRefused as soon as a try refuses."""
    pointer = _pointer_key(run)

    def change(raw: bytes | None) -> dict[str, Any] | None:
        manifest_key, (validation_key, _v) = check_promotable(store, run, step)
        cur = None if raw is None else Promotion.from_json(json.loads(raw))
        if cur is not None and cur.step == step:
            return None
        return _pointer_record(
            store, run, step, manifest_key, cur, by=by, validation_key=validation_key, reason="promoted"
        )

    try:  # the pointer's bytes are decoded in `change`: a refusal comes before a pointer that does not read
        res = update_json(
            store,
            pointer,
            change,
            dump=dump_json,
            load=bytes,
            create=True,
            attempts=attempts,
            what="promotion pointer",
        )
    except UpdateConflict:
        raise PromotionConflict(
            f"{pointer} changed while promoting step {step}: another writer promoted first; re-read and retry"
        ) from None
    if not res.written:  # the pointer names `step` already
        return Promotion.from_json(json.loads(res.value)).to_json()
    _put_history(store, run, res.value)
    return res.value


def write_pointer(
    store: ObjectStore,
    run: str,
    step: int,
    manifest_key: str,
    cur: tuple[Promotion, str] | None,
    **fields: Any,
) -> dict[str, Any]:
    """Compare-and-swap the pointer: write a promotion of `step` if the pointer is still `cur` (the
    (record, ETag) the caller read, or None for "no pointer yet"); PromotionConflict otherwise."""
    rec = _pointer_record(store, run, step, manifest_key, None if cur is None else cur[0], **fields)
    pointer = _pointer_key(run)
    try:
        put_if_unchanged(store, pointer, dump_json(rec), None if cur is None else cur[1])
    except PreconditionFailed:
        raise PromotionConflict(
            f"{pointer} changed while promoting step {step}: another writer promoted first; re-read and retry"
        ) from None
    _put_history(store, run, rec)
    return rec


def _pointer_record(
    store: ObjectStore, run: str, step: int, manifest_key: str, cur: Promotion | None, **fields: Any
) -> dict[str, Any]:
    """The promotion record of `step` that replaces pointer `cur` (None: the first). Backfills `cur`'s
    history entry and step index first, in case its writer died before recording them, and the whole
    step index when `cur` predates it (an unreadable history entry is left out, as `promoted_steps`
    always left it out)."""
    if cur is not None:
        _put_history(store, run, cur.to_json())
        if not cur.steps_indexed:  # promoted before the step index: index the history once
            for entry in catalog.promotion_history(store, run, problems=[]):
                _put_history(store, run, entry.to_json())
    return schema.record(
        "promotion",
        run=run,
        step=step,
        manifest_key=manifest_key,
        seq=cur.seq + 1 if cur else 1,
        previous_step=cur.step if cur else None,
        steps_indexed=True,
        **fields,
    )


def mark_suspect(
    store: ObjectStore, run: str, after_step: int, reason: str, *, incident_id: str | None = None
) -> dict[str, Any]:
    """Mark every checkpoint after `after_step` (the last known-good step) suspect: never picked, never
    promoted. If the pointer names a suspect checkpoint it is moved back to the newest promoted one that
    is not (when there is one). Idempotent per incident. Returns the suspect record."""
    if not isinstance(after_step, int) or after_step < 0:
        raise ValueError(f"after_step={after_step!r}: expected an int >= 0")
    ident = f"{after_step:08d}-{incident_id or uuid.uuid4().hex[:12]}"
    rec = schema.record("suspect", run=run, after_step=after_step, reason=reason, incident_id=incident_id)
    # once: else the same incident marked it already
    create_once(store, schema.store_key(run, schema.suspect_path(ident)), dump_json(rec))
    rec["pointer"] = _repoint_after_demotion(store, run)
    return rec


demote = mark_suspect


def _suspect(store: ObjectStore, run: str, marks: Sequence[SuspectMark], step: int) -> bool:
    return catalog.demoting_mark(marks, step, catalog.saved_at(store, run, step)) is not None


def _repoint_after_demotion(store: ObjectStore, run: str) -> str:
    """Move the pointer off a suspect checkpoint to the newest promoted one that is not; what was done.
    Decided again on the winner's pointer when another writer moves it meanwhile (POINTER_ATTEMPTS
    tries, then PromotionConflict)."""
    said = "unchanged"  # what the last run of `change` decided

    def change(raw: Any) -> dict[str, Any] | None:
        nonlocal said
        said = "unchanged"
        cur = None if raw is None else Promotion.from_json(raw)
        marks = catalog.suspect_marks(store, run)
        if cur is None or not _suspect(store, run, marks, cur.step):
            return None
        fallback = next(
            (
                s
                for s in reversed(catalog.promoted_steps(store, run))
                if catalog.saved_at(store, run, s) is not None and not _suspect(store, run, marks, s)
            ),
            None,
        )
        if fallback is None:
            said = f"unchanged: it names suspect step {cur.step} and no earlier promoted checkpoint exists"
            return None
        said = f"moved from step {cur.step} back to step {fallback}"
        return _pointer_record(
            store,
            run,
            fallback,
            schema.store_key(run, schema.manifest_path(fallback)),
            cur,
            reason="demoted",
            demoted_from=cur.step,
            by="mark_suspect",
        )

    try:
        res = update_json(
            store,
            _pointer_key(run),
            change,
            dump=dump_json,
            create=True,
            attempts=POINTER_ATTEMPTS,
            what="promotion pointer",
        )
    except UpdateConflict:
        raise PromotionConflict(
            f"pointer of run {run} kept changing while demoting ({POINTER_ATTEMPTS} attempts)"
        ) from None
    if res.written:
        _put_history(store, run, res.value)
    return said
