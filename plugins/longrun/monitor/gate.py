"""The checkpoint gate: validate a checkpoint, then promote it if it is valid and not suspect.

Pure of Airflow: the monitor runs it on each new checkpoint, `sdc_incident`'s pick on the ones that were
still uploading when the alert came, the finish on the final one.
"""

from __future__ import annotations

import time
from typing import Any

from longrun.checkpoints import catalog
from longrun.checkpoints.promote import PromotionConflict, PromotionRefused, promote
from longrun.runbooks import runbook_path
from training.store.interface import ObjectStore


def gate_checkpoint(
    store: ObjectStore, run: str, step: int, *, log: Any, by: str = "training_run.monitor"
) -> dict[str, Any]:
    """Validate then promote checkpoint `step`; a dict saying what happened (for logs and asset events)."""
    # torch only when a checkpoint is validated: the DAG files import the monitor's operator, which uses this
    from longrun.checkpoints.validate import validate

    t0 = time.perf_counter()
    v = validate(store, run, step)
    out: dict[str, Any] = {
        "step": step,
        "validated": bool(v["ok"]),
        "validate_s": round(time.perf_counter() - t0, 3),
    }
    if not v["ok"]:
        log.error(
            "checkpoint step %s of run %s FAILED validation: %s (runbook: %s)",
            step,
            run,
            "; ".join(v["errors"][:5]),
            runbook_path("checkpoint_validation_failed"),
        )
        out["errors"] = v["errors"][:5]
        return out
    try:  # a lost race is decided again on the winner's pointer, three tries in all
        rec = promote(store, run, step, by=by, attempts=3)
    except PromotionConflict as e:
        log.warning("promotion of step %s kept racing another writer: %s", step, e)
        out["refused"] = "promotion kept racing another writer"
        return out
    except PromotionRefused as e:
        log.warning("checkpoint step %s of run %s not promoted: %s", step, run, e)
        out["refused"] = str(e)
        return out
    out.update(promoted=True, manifest_key=rec["manifest_key"], seq=rec["seq"])
    try:
        m = catalog.checkpoints(store, run).by_step().get(step)
        if m is not None:
            out.update(
                loss=m.manifest.loss,
                saved_at=m.manifest.time,
                world=m.manifest.world.to_json(),
            )
    except Exception as e:  # metadata is a nicety; the promotion stands
        log.warning("could not read manifest metadata of step %s: %s", step, e)
    log.info("checkpoint step %s of run %s validated and promoted (seq %s)", step, run, rec["seq"])
    return out


def gate_pending(
    store: ObjectStore, run: str, *, before_step: int, log: Any, by: str
) -> list[dict[str, Any]]:
    """Gate every checkpoint with a manifest, step < `before_step`, never validated yet (ascending). One
    with a validation that does not read is gated too: its promotion is then refused, naming the key."""
    out = []
    for step in sorted(catalog.checkpoints(store, run).by_step()):
        if step >= before_step:
            continue
        try:
            pending = catalog.latest_validation(store, run, step) is None
        except ValueError:
            pending = True
        if pending:
            out.append(gate_checkpoint(store, run, step, log=log, by=by))
    return out
