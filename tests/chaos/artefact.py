"""A cell's artefact: what one run of one cell of the fault matrix did and found, as a JSON file kept in the
repository (docs/reliability/cells/<database>--<step>--<component>.json, the newest run of that cell).

docs/reliability.md's table is generated from these files (tests/chaos/table.py), so that each of its
entries names the commit it was proven on instead of being written by hand. A cell writes its artefact
whatever happens in its body: when it passes, when a check fails, when it is interrupted (the except path
of the cell); only a cell cut before its body (its setup: the stack, the clean reference run) has none.

The outcome (`outcome_of`):

- `failed`: an end-state check failed, or the drill did not end, or there was nothing to kill;
- `missed`: every check held, but when the kill landed a step that begins only after the cell's step
  (tests/chaos/grid.py NEXT) had already begun: the kill did not hit the step the cell names, so the
  cell proves nothing about it. Never `ok`;
- `ok`: every check held and no later step had begun (or none could be seen: `next_step_begun` is then
  null and the table says the window was not checked).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CELLS_DIR = ROOT / "docs" / "reliability" / "cells"
# Relative to the repository root: excluded from the dirty check, since a session's earlier cells write
# there while later cells run.
CELLS_REL = "docs/reliability/cells"
SCHEMA = 1
OUTCOMES = ("ok", "failed", "missed")


def cells_dir() -> Path:
    """Where artefacts go: LONGRUN_CHAOS_CELLS_DIR, else docs/reliability/cells of this checkout."""
    return Path(os.environ.get("LONGRUN_CHAOS_CELLS_DIR") or CELLS_DIR)


def artefact_name(database: str, step: str, component: str) -> str:
    return f"{database}--{step}--{component}.json"


def commit_id(root: Path = ROOT) -> str:
    """`git rev-parse HEAD` of `root`, with "+dirty" when its tree has changes (tracked or untracked,
    outside docs/reliability/cells). LONGRUN_CHAOS_COMMIT names it where there is no git repository (an
    exported copy, `git archive`); else "unknown"."""
    if named := os.environ.get("LONGRUN_CHAOS_COMMIT"):
        return named
    try:
        head = _git(root, "rev-parse", "HEAD").strip()
        changes = _git(root, "status", "--porcelain", "--", ".", f":(exclude){CELLS_REL}")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if changes.strip() else "")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True, timeout=60
    ).stdout


def outcome_of(*, passed: bool, next_step_begun: bool | None) -> str:
    """The cell's outcome from whether its checks held and whether a later step had begun at the kill."""
    if not passed:
        return "failed"
    return "missed" if next_step_begun is True else "ok"


@dataclass(frozen=True, slots=True)
class Moment:
    """When something happened: epoch seconds and seconds since the cell's drill started."""

    time: float
    since_start_s: float

    @classmethod
    def at(cls, t: float, start: float) -> Moment:
        return cls(time=round(t, 3), since_start_s=round(t - start, 3))


@dataclass(slots=True, kw_only=True)
class CellArtefact:
    """One run of one cell, filled in as the cell goes; `write` sets the outcome and writes the file."""

    database: str
    step: str
    component: str
    run: str
    commit: str
    drill: dict[str, Any]
    drill_started: float
    killed: dict[str, Any] | None = None
    """pid, name (the stack's record name, or `<dag>.<task>` for a task), node and why (slurmd only)."""
    step_reached: Moment | None = None
    kill_landed: Moment | None = None
    next_steps: dict[str, bool | None] = field(default_factory=dict)
    """Each step that begins only after this one (grid.NEXT): begun when the kill landed (None: unknown)."""
    next_step_begun: bool | None = None
    verdict: str | None = None
    """The incident's diagnosis verdict (`pass`, `fail`, `error`, `unconfirmed`; None: none recorded)."""
    incident: dict[str, Any] | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)
    drains: list[dict[str, Any]] = field(default_factory=list)
    final_fingerprint: str | None = None
    clean_fingerprint: str | None = None
    cell_line: str | None = None
    error: str | None = None
    outcome: str | None = None
    written: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    def write(self, *, passed: bool, directory: Path | None = None) -> Path:
        """Decide the outcome and write the file (atomically: a reader never sees half of it)."""
        self.outcome = outcome_of(passed=passed, next_step_begun=self.next_step_begun)
        self.written = round(time.time(), 3)
        out = directory or cells_dir()
        out.mkdir(parents=True, exist_ok=True)
        path = out / artefact_name(self.database, self.step, self.component)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
        return path


def load_all(directory: Path | None = None) -> list[dict[str, Any]]:
    """Every artefact in `directory`, by file name."""
    d = directory or cells_dir()
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))] if d.is_dir() else []
