"""What every stack component shares: its directory, its PID records, reuse and stop."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import procs
from .layout import Layout
from .procs import ProcRecord

Say = Callable[[str], None]
"""Where progress lines go (the CLI prints them; tests may collect them)."""

STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcStatus:
    """One recorded process as `status` reports it."""

    component: str
    """Component name (`slurm`, `s3`, `airflow`)."""
    name: str
    """Process name within the component."""
    pid: int
    """Recorded PID."""
    alive: bool
    """Whether that process still runs."""
    healthy: bool
    """Whether it also answers its health probe (always False when not alive)."""
    detail: str
    """Short health text, e.g. `idle` or `not responding`."""


class Component:
    """Base class: a group of daemons with one PID record file."""

    name = ""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.dir = layout.dir(self.name)

    @property
    def records_path(self) -> Path:
        return self.dir / "pids.json"

    def records(self) -> list[ProcRecord]:
        return procs.load_records(self.records_path)

    def _save(self, recs: list[ProcRecord]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        procs.save_records(self.records_path, recs)

    def _record(self, rec: ProcRecord) -> None:
        # Saved right after each spawn, so a failure later in `up` still leaves every PID to stop.
        recs = [r for r in self.records() if r.name != rec.name]
        self._save([*recs, rec])

    def live_record(self, name: str) -> ProcRecord | None:
        for rec in self.records():
            if rec.name == name and procs.alive(rec):
                return rec
        return None

    def is_recorded(self) -> bool:
        return bool(self.records())

    def all_alive(self) -> bool:
        recs = self.records()
        return bool(recs) and all(procs.alive(r) for r in recs)

    def down(self, say: Say) -> None:
        """Stop every recorded process, last started first, and forget them."""
        recs = self.records()
        if not recs:
            return
        t0 = time.monotonic()
        # Dependents were started after what they depend on: stop in reverse order, group by group.
        for group in self.stop_groups(recs):
            killed = procs.stop(group, timeout=STOP_TIMEOUT_S)
            for name in killed:
                say(f"  {self.name}: {name} ignored SIGTERM for {STOP_TIMEOUT_S:.0f} s, killed")
        still = [r.name for r in recs if procs.alive(r)]
        if still:
            raise procs.StackError(f"{self.name}: could not stop {', '.join(still)}")
        self.records_path.unlink(missing_ok=True)
        say(f"stopped {self.name} ({len(recs)} processes, {time.monotonic() - t0:.1f} s)")

    def stop_groups(self, recs: list[ProcRecord]) -> list[list[ProcRecord]]:
        """Groups stopped one after another; default: one at a time, newest first."""
        return [[r] for r in reversed(recs)]

    def forget_dead(self) -> None:
        """Drop records of processes that are gone (stale after a crash or reboot)."""
        recs = self.records()
        live = [r for r in recs if procs.alive(r)]
        if len(live) != len(recs):
            if live:
                self._save(live)
            else:
                self.records_path.unlink(missing_ok=True)

    def status(self) -> list[ProcStatus]:
        out = []
        for rec in self.records():
            is_alive = procs.alive(rec)
            healthy, detail = self.probe(rec) if is_alive else (False, "dead")
            out.append(
                ProcStatus(
                    component=self.name,
                    name=rec.name,
                    pid=rec.pid,
                    alive=is_alive,
                    healthy=healthy,
                    detail=detail,
                )
            )
        return out

    # To override
    def up(self, say: Say) -> None:
        raise NotImplementedError

    def probe(self, rec: ProcRecord) -> tuple[bool, str]:
        """Health of one live process: (healthy, short text)."""
        return True, "running"

    def env(self) -> dict[str, str]:
        """What a client needs to use this component (empty when it was never set up)."""
        return {}
