"""What a guarded run writes about itself: each incarnation's segment, fired drills, check records, the
report. Rank 0 writes the segment and the report; every rank its check records."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from training.checks.base import CheckResult
from training.events import EventWriter
from training.faults import Fault
from training.fingerprint.host import combine
from training.records import schema
from training.segment import FaultFired, Segment

log = logging.getLogger("training.api")


def code_version() -> str:
    if os.environ.get("LONGRUN_CODE_VERSION"):
        return os.environ["LONGRUN_CODE_VERSION"]
    try:
        return f"longrun {metadata.version('longrun')}"
    except metadata.PackageNotFoundError:
        return "unknown"


class RunRecords:
    """The records of one incarnation of a guarded run."""

    def __init__(
        self,
        *,
        run: str,
        rank: int,
        world: int,
        node: str,
        nodes: list[str],
        events: EventWriter,
        segment: Segment,
    ) -> None:
        self.run, self.rank, self.world, self.node, self.nodes = run, rank, world, node, nodes
        self.events = events
        self.segment = segment
        self.last_pass: dict[str, int] = {}
        self.last_step: int | None = None

    def write_segment(self, **changes: Any) -> None:
        """Rank 0 records where this incarnation started, its first healthy step and its end."""
        self.segment = dataclasses.replace(self.segment, **changes)
        if self.rank == 0:
            self.events.put_record(self.segment.relative_path, self.segment.to_json())

    def fault_fired(self, fault: Fault, step: int) -> None:
        rec = FaultFired(
            run=self.run, fault=fault.kind, step=step, rank=self.rank, node=self.node,
            time=time.time(), spec=fault.spec(),
        )  # fmt: skip
        self.events.put_record(rec.relative_path, rec.to_json())

    def checks(self, results: list[CheckResult], loss: float | None) -> None:
        """One check record per result; the step's mean loss rides on each (the run-health view plots it)."""
        if loss is not None and not math.isfinite(loss):
            loss = None  # a NaN is the finite check's business; keep the records strict JSON
        for r in results:
            if r.verdict == "pass":
                self.last_pass[r.check] = r.step
            self.events.check(
                schema.record(
                    "check",
                    run=self.run,
                    step=r.step,
                    check=r.check,
                    verdict=r.verdict,
                    rank=self.rank,
                    world_size=self.world,
                    duration_s=round(r.duration_s, 6),
                    loss=loss,
                )  # fmt: skip
            )

    def end_segment(self, outcome: str) -> None:
        if self.segment.exit is not None:
            return
        try:
            self.write_segment(last_step=self.last_step, ended_at=time.time(), exit=outcome)
        except Exception as e:  # never hide the real error of the run behind a record write
            log.warning("segment end record not written: %s", e)

    def report(self, *, final_step: int, fingerprints: Mapping[str, str]) -> None:
        """Rank 0 writes the run report; `fingerprints` are what two runs are compared by (Guard)."""
        fps = dict(fingerprints)
        if self.rank == 0:
            self.events.report(
                schema.record(
                    "report",
                    run=self.run,
                    final_step=final_step,
                    final_fingerprint=combine(fps),
                    fingerprints=fps,
                    world_size=self.world,
                    nodes=self.nodes,
                    code_version=code_version(),
                    last_pass=self.last_pass,
                )  # fmt: skip
            )
