"""What the trainer writes about its run: each incarnation's segment, fired drills, check records, the report."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from importlib import metadata
from typing import Any

from training import schema
from training.checks import CheckResult
from training.config import TrainConfig
from training.dist import Placement
from training.events import EventWriter
from training.faults import Fault
from training.fingerprint import combine, fingerprint_state
from training.model import LM
from training.segment import FaultFired, Segment

log = logging.getLogger("training.loop")  # the trainer's logger, as before the split


def code_version() -> str:
    if os.environ.get("LONGRUN_CODE_VERSION"):
        return os.environ["LONGRUN_CODE_VERSION"]
    try:
        return f"longrun {metadata.version('longrun')}"
    except metadata.PackageNotFoundError:
        return "unknown"


class RunRecords:
    """Mixin of `training.loop.Trainer`: the records it writes about its run (rank 0 writes the segment
    and the report, every rank its check records)."""

    cfg: TrainConfig
    rank: int
    world: int
    nodes: list[str]
    place: Placement
    events: EventWriter
    model: LM
    segment: Segment
    last_pass: dict[str, int]
    _last_step: int | None

    def _write_segment(self, **changes: Any) -> None:
        """Rank 0 records where this incarnation started, its first healthy step and its end."""
        self.segment = dataclasses.replace(self.segment, **changes)
        if self.rank == 0:
            self.events.put_record(self.segment.relative_path, self.segment.to_json())

    def _fault_fired(self, fault: Fault, step: int) -> None:
        rec = FaultFired(
            run=self.cfg.run, fault=fault.kind, step=step, rank=self.rank, node=self.place.node,
            time=time.time(), spec=fault.spec(),
        )  # fmt: skip
        self.events.put_record(rec.relative_path, rec.to_json())

    def _record(self, results: list[CheckResult], loss: float | None) -> None:
        # The step's mean loss rides on each check record: the run-health view plots it per step.
        if loss is not None and not math.isfinite(loss):
            loss = None  # a NaN is the finite check's business; keep the records strict JSON
        for r in results:
            if r.verdict == "pass":
                self.last_pass[r.check] = r.step
            self.events.check(
                schema.record(
                    "check",
                    run=self.cfg.run,
                    step=r.step,
                    check=r.check,
                    verdict=r.verdict,
                    rank=self.rank,
                    world_size=self.world,
                    duration_s=round(r.duration_s, 6),
                    loss=loss,
                )  # fmt: skip
            )

    def _end_segment(self, outcome: str) -> None:
        if self.segment.exit is not None:
            return
        try:
            self._write_segment(last_step=self._last_step, ended_at=time.time(), exit=outcome)
        except Exception as e:  # never hide the real error of the run behind a record write
            log.warning("segment end record not written: %s", e)

    def _finish(self) -> None:
        fps = fingerprint_state(self.model.state_dict())
        if self.rank == 0:
            self.events.report(
                schema.record(
                    "report",
                    run=self.cfg.run,
                    final_step=self.cfg.steps,
                    final_fingerprint=combine(fps),
                    fingerprints=fps,
                    world_size=self.world,
                    nodes=self.nodes,
                    code_version=code_version(),
                    last_pass=self.last_pass,
                )  # fmt: skip
            )
