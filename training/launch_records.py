"""What this launch wrote since it started (`LONGRUN_LAUNCH_T0`): its newest checkpoint, its alerts, its
in-job restart count; read by the restarted trainer and by the job script after `srun` returns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training import schema
from training.records import Progress

#: Exported by the job script (longrun.launch): when this launch started, epoch seconds.
LAUNCH_T0_ENV = "LONGRUN_LAUNCH_T0"


def newest_checkpoint_since(
    run_dir: Path, since: float, *, run: str | None = None, store: Any = None
) -> str | None:
    """The newest complete checkpoint (manifest present) written at or after `since`: a local directory,
    else a store prefix (where the run dir is node-local), else None."""
    best: tuple[int, str] | None = None
    for mpath in (run_dir / "checkpoints").glob("step-*/manifest.json"):
        step = schema.step_of_manifest_key(str(mpath))
        if step is not None and _record_time(mpath.read_bytes(), "manifest") >= since:
            if best is None or step > best[0]:
                best = (step, str(mpath.parent))
    if best is None and store is not None and run is not None:
        for info in store.list(schema.store_key(run, "checkpoints/")):
            step = schema.step_of_manifest_key(info.key)
            if step is not None and (best is None or step > best[0]):
                if _record_time(store.get_bytes(info.key), "manifest") >= since:
                    best = (step, info.key[: -len("manifest.json")])
    return best[1] if best else None


def alerts_since(run_dir: Path, since: float, *, run: str | None = None, store: Any = None) -> list[str]:
    """Alert records written at or after `since` (epoch seconds): in the run dir, and in `store` when given.

    The store matters where the run dir is node-local and the alerting rank ran on another node.
    """
    found: list[str] = []
    for path in sorted((run_dir / "alerts").glob("*.json")):
        if _alert_time(path.read_bytes()) >= since:
            found.append(str(path))
    if store is not None and run is not None:
        prefix = schema.store_key(run, "alerts/")
        for info in store.list(prefix):
            if info.key.endswith(".json") and _alert_time(store.get_bytes(info.key)) >= since:
                found.append(info.key)
    return found


def _alert_time(raw: bytes) -> float:
    return _record_time(raw, "alert")


def _record_time(raw: bytes, kind: str) -> float:
    try:
        obj = json.loads(raw)
        schema.validate(kind, obj)
        return float(obj["time"])
    except (ValueError, schema.SchemaError):
        # A torn or foreign file is not proof of a verdict; the orchestrator reads the store anyway.
        return float("-inf")


def restarts_since(run_dir: Path, since: float) -> int | None:
    """The job-wide in-job restart count of the last progress record written since `since`, or None."""
    try:
        prog = Progress.from_json(json.loads((run_dir / schema.PROGRESS_PATH).read_bytes()))
    except (OSError, ValueError):  # a SchemaError is a ValueError
        return None
    return prog.restart_count if prog.time >= since else None
