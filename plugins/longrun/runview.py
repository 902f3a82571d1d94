"""The read model of one run: what the store says the run looks like, as typed records.

One place answers "what does this run look like": its heartbeat and report, check records, alerts, the
checkpoints and the state of each (saved, validated, invalid, promoted, suspect), the weight votes, the
incidents and the attempts (segments). The UI, `longrun records`, the audit and the drill read through it.

Reads only. The store is one `ObjectStore`; with two sides configured it is the `SidedStore` that routes
each key to the job's or the orchestrator's bucket (`training.store.sides`), so one key layout serves both.
A record that does not read is listed in `problems` and skipped, so one bad object never hides the rest;
a store that cannot be listed is a problem too, not an exception.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from longrun.checkpoints import catalog
from longrun.votes import Vote, vote
from training import segment
from training.records import schema
from training.records.alert import Alert
from training.records.base import Record
from training.records.job import CheckRecord, Manifest, Progress, Report
from training.records.orchestrator import Incident, Promotion, SuspectMark, Validation
from training.store.interface import NotFound, ObjectStore, StoreError

R = TypeVar("R", bound=Record)

#: Folders and files of a run's records, by family (`longrun records --kind`).
FAMILIES: Mapping[str, str] = {
    "alerts": "alerts/",
    "checks": "checks/",
    "incidents": "incidents/",
    "validations": "validations/",
    "suspect": "suspect/",
    "security-events": "security-events/",
    "promotions": "promoted/",
    "checkpoints": "checkpoints/",
    "picks": "picks/",
    "saves": "saves/",
    "segments": segment.SEGMENTS_DIR,
    "progress": schema.PROGRESS_PATH,
    "report": schema.REPORT_PATH,
}

#: How many of the newest steps `recent_checks` covers: what the run-health page shows.
RECENT_CHECK_STEPS = 200

#: A checkpoint's states, in the order a later one overrides an earlier one.
STATES = ("saved", "validated", "invalid", "promoted", "suspect")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointState:
    """One checkpoint as the gate left it."""

    step: int
    state: str
    """One of STATES."""
    manifest: Manifest
    validation_errors: tuple[str, ...] = ()
    """The latest validation's errors, when it failed."""
    current: bool = False
    """The promoted pointer names it."""


class RunView:
    """The records of run `run` in `store`; each family is read once, on first use."""

    def __init__(self, store: ObjectStore, run: str) -> None:
        self.store, self.run = store, schema.check_run_name(run)
        self.prefix = schema.run_prefix(run)
        self.problems: list[str] = []

    # ---- reading ------------------------------------------------------------------------------------

    def keys(self, relative_prefix: str) -> list[str]:
        """Keys relative to the run under `relative_prefix`, sorted (a failed listing is a problem)."""
        try:
            infos = list(self.store.list(self.prefix + relative_prefix))
        except StoreError as e:
            self.problems.append(f"{relative_prefix}: cannot list ({e})")
            return []
        return sorted(i.key[len(self.prefix) :] for i in infos)

    def text(self, relative: str) -> str | None:
        try:
            return self.store.get_bytes(self.prefix + relative).decode()
        except NotFound:
            return None
        except (StoreError, UnicodeDecodeError) as e:
            self.problems.append(f"{relative}: cannot read ({e})")
            return None

    def record(self, cls: type[R], relative: str) -> R | None:
        """The record at `relative`, or None (absent, or unreadable: then a problem)."""
        body = self.text(relative)
        return None if body is None else self._parse(cls, relative, body)

    def lines(self, cls: type[R], relative: str) -> list[R]:
        """The records of a JSON-lines object."""
        body = self.text(relative) or ""
        found = (
            self._parse(cls, f"{relative}:{n}", line)
            for n, line in enumerate(body.splitlines(), 1)
            if line.strip()
        )
        return [r for r in found if r is not None]

    def folder(self, cls: type[R], relative_dir: str) -> Iterator[tuple[str, R]]:
        """(relative key, record) for every `.json` directly in `relative_dir` (attachments skipped)."""
        for key in self.keys(relative_dir):
            if key.endswith(".json") and "/" not in key[len(relative_dir) :]:
                rec = self.record(cls, key)
                if rec is not None:
                    yield key, rec

    def _parse(self, cls: type[R], where: str, body: str) -> R | None:
        try:
            return cls.from_json(json.loads(body))
        except ValueError as e:
            self.problems.append(f"{where}: not a {cls.KIND} record ({e})")
            return None

    # ---- the job's records --------------------------------------------------------------------------

    @functools.cached_property
    def progress(self) -> Progress | None:
        return self.record(Progress, schema.PROGRESS_PATH)

    @functools.cached_property
    def progress_history(self) -> tuple[Progress, ...]:
        """Every heartbeat the store kept under progress/ (JSON or JSON lines), the latest included."""
        found: list[Progress] = []
        for key in self.keys("progress/"):
            if key.endswith(".jsonl"):
                found += self.lines(Progress, key)
            elif (rec := self.record(Progress, key)) is not None:
                found.append(rec)
        return tuple(found)

    @functools.cached_property
    def report(self) -> Report | None:
        return self.record(Report, schema.REPORT_PATH)

    @functools.cached_property
    def checks(self) -> tuple[CheckRecord, ...]:
        """Check records by (step, check); a batch written twice (a retried flush) counts once."""
        seen: dict[tuple[int, str, int], CheckRecord] = {}
        for key in self.keys("checks/"):
            for rec in self.lines(CheckRecord, key):
                seen[(rec.step, rec.check, rec.rank)] = rec
        return tuple(sorted(seen.values(), key=lambda c: (c.step, c.check)))

    @functools.cached_property
    def newest_step(self) -> int | None:
        """The newest step the run has told of: its heartbeat, its report or its newest checkpoint."""
        steps = [p.step for p in [self.progress] if p] + [r.final_step for r in [self.report] if r]
        return max(steps + list(self.manifests), default=None)

    def recent_checks(self, steps: int = RECENT_CHECK_STEPS) -> tuple[CheckRecord, ...]:
        """The check records of the run's newest `steps` steps (up to `newest_step`; the first `steps`
        when it is unknown), by (step, check), each (step, check, rank) once.

        Why not `checks`: that lists and reads every batch the run ever wrote, which grows with its age.
        This lists only the key windows that can hold those steps (a batch spans at most
        schema.CHECK_BATCH_MAX_SPAN steps, so a batch starting up to that far back may reach in), and reads
        only the batches in them that do: a bounded read at any age. A record counts under the pick's rule,
        read by the pick's reader (`catalog.read_check_batch`): it must be of the rank and within the steps
        its key names; one that is not, or does not read, is a problem. Past the keys' step limit the windows no longer sort, and
        every batch is read."""
        if steps < 1:
            raise ValueError(f"steps={steps}: must be at least 1")
        newest = self.newest_step if self.newest_step is not None else steps - 1
        lowest = max(0, newest - steps + 1)
        try:
            if newest >= schema.CHECK_BATCH_STEP_LIMIT:
                batches = catalog.check_batches(self.store, self.run)
            else:
                window = schema.CHECK_BATCH_WINDOW
                first_window = max(0, lowest - schema.CHECK_BATCH_MAX_SPAN + 1) // window * window
                batches = [
                    b
                    for start in range(first_window, newest // window * window + 1, window)
                    for b in catalog.check_batches_in_window(self.store, self.run, start)
                ]
        except StoreError as e:
            self.problems.append(f"checks/: cannot list ({e})")
            return ()
        seen: dict[tuple[int, str, int], CheckRecord] = {}
        for batch in batches:
            if batch.last < lowest or batch.first > newest:
                continue
            try:
                records = catalog.read_check_batch(self.store, batch, problems=self.problems)
            except StoreError as e:
                self.problems.append(f"{batch.key}: cannot read ({e})")
                continue
            for rec in records:
                if lowest <= rec.step <= newest:
                    seen[(rec.step, rec.check, rec.rank)] = rec
        return tuple(sorted(seen.values(), key=lambda c: (c.step, c.check)))

    @functools.cached_property
    def alerts(self) -> tuple[tuple[str, Alert], ...]:
        """(relative key, alert), oldest step first."""
        return tuple(sorted(self.folder(Alert, "alerts/"), key=lambda ka: (ka[1].step, ka[1].time)))

    @functools.cached_property
    def manifests(self) -> dict[int, Manifest]:
        """Checkpoints whose manifest reads and names this run and its step, by step."""
        out = {}
        for key in self.keys("checkpoints/"):
            step = schema.step_of_manifest_key(key)
            m = self.record(Manifest, key) if step is not None else None
            if m is None:
                continue
            if (m.run, m.step) != (self.run, step):
                self.problems.append(f"{key}: manifest says run {m.run!r} step {m.step}")
                continue
            out[m.step] = m
        return out

    @functools.cached_property
    def attempts(self) -> tuple[segment.Segment, ...]:
        """Every incarnation of the trainer (launch or in-job restart), in order."""
        found = []
        for key in self.keys(segment.SEGMENTS_DIR):
            body = self.text(key) if key.endswith(".json") else None
            if body is None:
                continue
            try:
                found.append(segment.Segment.from_json(body))
            except ValueError as e:
                self.problems.append(f"{key}: not a segment record ({e})")
        return tuple(segment.ordered(found))

    @functools.cached_property
    def world_size(self) -> int | None:
        """Replicas, from the heartbeat, else a manifest's world, else an alert's."""
        if self.progress and self.progress.world_size:
            return self.progress.world_size
        for m in self.manifests.values():
            if m.world.world_size:
                return m.world.world_size
        for _key, a in self.alerts:
            if a.world and a.world.world_size:
                return a.world.world_size
            if a.fingerprints_by_rank:
                return len(a.fingerprints_by_rank)
        return None

    # ---- the orchestrator's records -----------------------------------------------------------------

    @functools.cached_property
    def validations(self) -> dict[int, tuple[Validation, ...]]:
        """Validation records by step, oldest first."""
        by_step: dict[int, list[Validation]] = {}
        for _key, v in self.folder(Validation, "validations/"):
            by_step.setdefault(v.step, []).append(v)
        return {s: tuple(sorted(vs, key=lambda v: v.time)) for s, vs in by_step.items()}

    @functools.cached_property
    def promotions(self) -> tuple[Promotion, ...]:
        """The promotion history, by sequence number."""
        return tuple(
            sorted((p for _k, p in self.folder(Promotion, "promoted/history/")), key=lambda p: p.seq)
        )

    @functools.cached_property
    def promoted_steps(self) -> frozenset[int]:
        """Every step ever promoted: the pointer's, and the step index (`promoted/steps/`, keys only) where
        the pointer says it is complete, else the history (one get per promotion, for a run promoted before
        the index existed); as `longrun.checkpoints.catalog.promoted_steps` reads them."""
        pointer = self.pointer
        if pointer is not None and pointer.steps_indexed:
            found = {schema.step_of_promoted_key(k) for k in self.keys(schema.PROMOTED_STEPS_DIR)}
            steps = {s for s in found if s is not None}
        else:
            steps = {p.step for p in self.promotions}
        return frozenset(steps | ({pointer.step} if pointer is not None else set()))

    @functools.cached_property
    def pointer(self) -> Promotion | None:
        """The promoted pointer (`promoted/current.json`), or None before the first promotion."""
        return self.record(Promotion, schema.PROMOTED_POINTER_PATH)

    @functools.cached_property
    def suspect_marks(self) -> tuple[SuspectMark, ...]:
        return tuple(
            sorted((s for _k, s in self.folder(SuspectMark, "suspect/")), key=lambda s: s.after_step)
        )

    def demoting_mark(self, step: int, saved_at: float | None) -> SuspectMark | None:
        """The mark that makes checkpoint `step` (saved at `saved_at`) suspect, or None."""
        return next((m for m in self.suspect_marks if m.demotes(step, saved_at)), None)

    @functools.cached_property
    def incidents(self) -> tuple[tuple[str, Incident], ...]:
        """(relative key, incident), oldest first (plots and other attachments are not records)."""
        found = list(self.folder(Incident, "incidents/"))
        return tuple(sorted(found, key=lambda ki: (ki[1].opened_at, ki[1].incident_id)))

    # ---- answers ------------------------------------------------------------------------------------

    def checkpoints(self) -> tuple[CheckpointState, ...]:
        """Every checkpoint with its state: promoted beats validated; suspect beats everything."""
        promoted = self.promoted_steps
        current = self.pointer.step if self.pointer else None
        out = []
        for step, m in sorted(self.manifests.items()):
            state, errors = "saved", tuple[str, ...]()
            if vs := self.validations.get(step):
                state = "validated" if vs[-1].ok else "invalid"
                errors = () if vs[-1].ok else vs[-1].errors
            if step in promoted:
                state = "promoted"
            if self.demoting_mark(step, m.time) is not None:
                state = "suspect"
            out.append(
                CheckpointState(
                    step=step, state=state, manifest=m, validation_errors=errors, current=step == current
                )
            )
        return tuple(out)

    def votes(self, checks: tuple[CheckRecord, ...] | None = None) -> tuple[Vote, ...]:
        """Agreement at each weight vote in `checks` (default: every check record of the run)."""
        world = self.world_size
        records = self.checks if checks is None else checks
        return tuple(v for c in records if c.check == "weight_vote" for v in [vote(c, world)] if v)


def list_runs(store: ObjectStore) -> list[str]:
    """Run names that have at least one object in the store, sorted: one folder listing of `runs/`, not
    a listing of every object of every run."""
    return sorted(d[len("runs/") : -1] for d in store.list_dirs("runs/"))
