"""What this launch wrote since it started (`LONGRUN_LAUNCH_T0`): its newest checkpoint, its alerts, its
in-job restart count; read by the restarted trainer and by the job script after `srun` returns."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from training.records import schema, signing
from training.records.job import Progress

#: Exported by the job script (longrun.launch): when this launch started, epoch seconds.
LAUNCH_T0_ENV = "LONGRUN_LAUNCH_T0"

log = logging.getLogger("training.launch_records")


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


def alerts_since(
    run_dir: Path,
    since: float,
    *,
    run: str | None = None,
    store: Any = None,
    job: signing.ThisJob | None = None,
) -> list[str]:
    """This job's alert records written at or after `since` (epoch seconds): in the run dir, and in
    `store` when given.

    The store matters where the run dir is node-local and the alerting rank ran on another node. Only
    alerts `signing.alert_not_mine` accepts count (`job`: this job's key and id, by default from the
    environment): anyone holding the job side's store credentials can write under `alerts/`, and a forged
    alert counted here would turn a clean launch into the SDC verdict. Each one passed over is named in a
    warning."""
    job = signing.ThisJob.from_env() if job is None else job
    found: list[str] = []
    for path in sorted((run_dir / "alerts").glob("*.json")):
        if _own_alert_since(path.read_bytes(), str(path), since, job=job, run=run):
            found.append(str(path))
    if store is not None and run is not None:
        prefix = schema.store_key(run, "alerts/")
        for info in store.list(prefix):
            if info.key.endswith(".json"):
                if _own_alert_since(store.get_bytes(info.key), info.key, since, job=job, run=run):
                    found.append(info.key)
    return found


def _own_alert_since(raw: bytes, where: str, since: float, *, job: signing.ThisJob, run: str | None) -> bool:
    """Whether `raw` is a well-formed alert raised at or after `since` by this job (a warning names one
    of that time that is not this job's; older ones are an earlier launch's and pass silently)."""
    if _record_time(raw, "alert") < since:
        return False
    why = signing.alert_not_mine(json.loads(raw), job=job, run=run)
    if why is not None:
        log.warning("alert %s is not this job's (%s): not counted", where, why)
    return why is None


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
