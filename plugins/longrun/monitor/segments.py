"""The trainer's records of how a run ran, as the orchestrator reads them: its segments (where each
incarnation of the trainer started, its first healthy step, where it ended) and its fault records (when a
drill's fault fired).

Read, never computed from the plan. The finish of a run reports them (`segment_table`, `drill_outcome`);
an incident measures its time to recover from them (longrun.incident.recovery), and the hot-spare path
finds the directed attempt among them (`job_step`). A record that does not read is logged and left out.
"""

from __future__ import annotations

import logging
from typing import Any

from training.records import schema
from training.segment import FAULTS_DIR, SEGMENTS_DIR, FaultFired, Segment, last_trained, lost_steps, ordered
from training.store.interface import ObjectStore, StoreError

log = logging.getLogger("longrun.monitor.segments")


def _read_all(store: ObjectStore, run: str, folder: str) -> list[bytes]:
    out = []
    for info in store.list(schema.store_key(run, folder)):
        if info.key.endswith(".json"):
            try:
                out.append(store.get_bytes(info.key))
            except StoreError as e:
                log.warning("record %s unreadable: %s", info.key, e)
    return out


def segments(store: ObjectStore, run: str) -> list[Segment]:
    """The run's segments in the order they ran; a malformed record is logged and left out."""
    found = []
    for raw in _read_all(store, run, SEGMENTS_DIR):
        try:
            found.append(Segment.from_json(raw))
        except ValueError as e:
            log.warning("segment record of run %s refused: %s", run, e)
    return ordered([s for s in found if s.run == run])


def faults(store: ObjectStore, run: str) -> list[FaultFired]:
    found = []
    for raw in _read_all(store, run, FAULTS_DIR):
        try:
            found.append(FaultFired.from_json(raw))
        except ValueError as e:
            log.warning("fault record of run %s refused: %s", run, e)
    return sorted((f for f in found if f.run == run), key=lambda f: f.time)


def segment_table(segs: list[Segment]) -> list[dict[str, Any]]:
    """One row per segment for the run report: where it started, what it trained, how it ended."""
    rows = []
    for i, s in enumerate(segs):
        before = last_trained(segs[:i])
        rows.append(
            {
                "segment": s.segment_id,
                "job_id": s.job_id,
                "restart_count": s.restart_count,
                "start_step": s.start_step,
                "resumed_from": s.resumed_from,
                "first_step": s.first_step,
                "first_healthy_step": s.first_healthy_step,
                "last_step": s.last_step,
                "exit": s.exit,
                "nodes": sorted(set(s.nodes)),
                "lost_steps_before": lost_steps(before, s) if before else None,
            }
        )
    return rows


def job_step(seg: Segment) -> str:
    """`<job>.<step>` of a segment id: an NVRx in-job restart keeps it, a relaunch inside the job does not."""
    return seg.segment_id.rsplit("-r", 1)[0]


class DrillNotFired(RuntimeError):
    """A drill run ended without its fault ever being injected: it proved nothing."""


def drill_outcome(drill_flag: str | None, fired: list[FaultFired]) -> dict[str, Any] | None:
    """Did the run's drill (`KIND:STEP:TARGET`) fire? None for a run without a drill."""
    if not drill_flag:
        return None
    mine = [f for f in fired if f.spec == drill_flag]
    return {
        "drill": drill_flag,
        "fired": bool(mine),
        "step": mine[0].step if mine else None,
        "nodes": sorted({f.node for f in mine}),
        "time": mine[0].time if mine else None,
    }
