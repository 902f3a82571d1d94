"""Build a store of model checkpoints and their records for audit tests, through training.records.schema."""

from __future__ import annotations

import hashlib
from typing import Any

from training.records import schema
from training.store.interface import ObjectStore, put_json

T0 = 1_780_000_000.0  # a fixed clock: record times are explicit so save/validate/promote order is clear


def put_checkpoint(
    store: ObjectStore,
    run: str,
    step: int,
    *,
    time: float | None = None,
    loss: float | None = 2.5,
    weight_vote: dict[str, Any] | None = None,
    sha256: str | None = None,
    **extra: Any,
) -> str:
    """A one-file model checkpoint: payload object first, manifest last (as the saver does)."""
    payload = f"weights of {run} at step {step}".encode() * 64
    rel = schema.checkpoint_dir(step) + "model.pt"
    store.put_bytes(schema.store_key(run, rel), payload)
    manifest = schema.record(
        "manifest",
        run=run,
        step=step,
        time=T0 + step if time is None else time,
        files=[
            {
                "name": "model.pt",
                "key": rel,
                "size": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest() if sha256 is None else sha256,
            }
        ],
        fingerprints={"w": "00ff00ff00ff00ff"},
        weight_vote={"verdict": "pass", "agree": 3, "world": 3} if weight_vote is None else weight_vote,
        coverage={"recompute": step},
        loss=loss,
        code_version="test",
        world={"size": 3},
        **extra,
    )
    key = schema.store_key(run, schema.manifest_path(step))
    put_json(store, key, manifest)
    return key


def put_validation(
    store: ObjectStore, run: str, step: int, *, ok: bool = True, time: float, ident: str = "v1"
) -> str:
    """A validation record of the manifest as it is now (its ETag), as longrun's validator writes it."""
    key = schema.store_key(run, schema.validation_path(step, ident))
    errors = [] if ok else ["model.pt: sha256 mismatch"]
    manifest = store.head(schema.store_key(run, schema.manifest_path(step)))
    rec = schema.record(
        "validation",
        run=run,
        step=step,
        ok=ok,
        errors=errors,
        time=time,
        manifest_etag=manifest.etag if manifest else None,
    )
    put_json(store, key, rec)
    return key


def put_promotion(
    store: ObjectStore, run: str, step: int, *, seq: int, time: float, current: bool = True
) -> None:
    rec = schema.record(
        "promotion",
        run=run,
        step=step,
        manifest_key=schema.store_key(run, schema.manifest_path(step)),
        time=time,
        seq=seq,
    )
    put_json(store, schema.store_key(run, schema.promotion_history_path(seq)), rec)
    if current:
        put_json(store, schema.store_key(run, schema.PROMOTED_POINTER_PATH), rec)


def put_suspect(
    store: ObjectStore,
    run: str,
    *,
    after_step: int,
    time: float,
    until_step: int | None = None,
    ident: str = "i1",
) -> None:
    fields: dict[str, Any] = {"until_step": until_step} if until_step is not None else {}
    rec = schema.record("suspect", run=run, after_step=after_step, reason="sdc alert", time=time, **fields)
    put_json(store, schema.store_key(run, schema.suspect_path(ident)), rec)


def put_incident(store: ObjectStore, run: str, ident: str = "i1") -> None:
    rec = schema.record(
        "incident",
        run=run,
        incident_id=ident,
        alert={"check": "weight_vote", "step": 27},
        timeline=[{"event": "drained", "node": "n2"}],
        mode="act",
    )
    put_json(store, schema.store_key(run, schema.incident_path(ident)), rec)


def healthy_run(store: ObjectStore, run: str, steps: tuple[int, ...] = (10, 20, 30)) -> None:
    """Checkpoints saved, validated ok, then promoted, in that order."""
    for seq, step in enumerate(steps, start=1):
        put_checkpoint(store, run, step)
        put_validation(store, run, step, time=T0 + step + 0.3)
        put_promotion(store, run, step, seq=seq, time=T0 + step + 0.6, current=step == steps[-1])


def run_with_incident(store: ObjectStore, run: str) -> None:
    """Steps 10, 20, 30 saved and promoted; then an alert: everything after the last known-good step 20 is
    suspect (no upper bound), the pointer goes back to 20 after the declaration, and the relaunched job
    saves 30 again (overwriting the suspect one), validated and promoted after the declaration."""
    healthy_run(store, run)
    declared = T0 + 40
    put_suspect(store, run, after_step=20, time=declared)
    put_incident(store, run)
    put_promotion(store, run, 20, seq=4, time=declared + 1)
    put_checkpoint(store, run, 30, time=declared + 30)
    put_validation(store, run, 30, time=declared + 31, ident="v2")
    put_promotion(store, run, 30, seq=5, time=declared + 32)
