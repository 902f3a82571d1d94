"""The pre-incident pick: which checkpoint to restart from after an alert, and why.

Rule: the newest promoted checkpoint whose step is at or before the last step known good by the check that
fired and by every check able to see a finite wrong value (`schema.CHECKS_FOR_ALERT[alert check]`: a node may
produce finite wrong numbers before its first NaN, so a finite alert is bounded by the recompute audit and the
weight vote too). A check's last known-good step is the newest step before the alert's at which EVERY rank of
that step's world recorded a pass and none a failure, from the run's check records (checks/*.jsonl, batch
files per rank; only the batches near the alert are read, so the pick's cost does not grow with the age of the
run: `scan_last_known_good`). A rank with no record is not a pass; neither is a record that does not say its
world size (when the alert does not say it either), nor the coverage a manifest claims (one rank's view). A
suspect checkpoint (after a demotion mark) and one whose newest validation did not pass are never picked. When
a check in the class has no all-rank pass before the alert, nothing is provably from before the fault and the
pick is None.

A check the run does not run (the orchestrator's own launch record says so: a recompute cadence of 0, or an
FSDP2 run, which has no vote) bounds nothing: it leaves the class,
and the pick rests on the checks that ran. Without that record every check of the class counts, and a run
that never ran one of them restarts from step 0. The pick is then as strong as the checks the run chose
(docs/checkpoints.md, docs/sharding.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longrun.checkpoints import catalog
from training.records import schema
from training.records.alert import AlertRef
from training.records.job import CheckRecord
from training.store.interface import ObjectStore, put_json


def _alert_fields(alert: Mapping[str, Any]) -> tuple[str, int]:
    check = alert.get("check")
    step = alert.get("step")
    if check not in schema.CHECKS_FOR_ALERT:
        raise ValueError(f"alert check {check!r}: expected one of {sorted(schema.CHECKS_FOR_ALERT)}")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"alert step {step!r}: expected an int >= 0")
    return str(check), step


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _world(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _check_records(records: Iterable[CheckRecord | Mapping[str, Any]]) -> Iterator[CheckRecord]:
    """The records as typed check records; one that does not read as a check record is no evidence."""
    for r in records:
        if isinstance(r, CheckRecord):
            yield r
            continue
        try:
            yield CheckRecord.from_json(r)
        except ValueError:
            continue


class _Evidence:
    """Check records gathered so far, and whether a (check, step) is an all-rank pass: every rank of the
    step's world passed and none failed. The world is the `world_size` the step's records state (they
    must agree), else the one given (the alert's)."""

    def __init__(self, checks: tuple[str, ...], world_size: int | None) -> None:
        self.checks, self.world_size = checks, world_size
        self.passed: dict[tuple[str, int], set[int]] = {}
        self.failed: set[tuple[str, int]] = set()
        self.worlds: dict[tuple[str, int], set[int | None]] = {}
        self.steps: dict[str, set[int]] = {c: set() for c in checks}

    def add(self, records: Iterable[CheckRecord | Mapping[str, Any]]) -> None:
        for r in _check_records(records):
            if r.check not in self.checks or not _is_index(r.step) or not _is_index(r.rank):
                continue  # negative
            k = (r.check, r.step)
            self.steps[r.check].add(r.step)
            self.worlds.setdefault(k, set()).add(_world(r.world_size))
            if r.verdict == "pass":
                self.passed.setdefault(k, set()).add(r.rank)
            elif r.verdict == "fail":
                self.failed.add(k)

    def all_passed(self, check: str, step: int) -> bool:
        k = (check, step)
        if k in self.failed or k not in self.passed:
            return False
        stated = {w for w in self.worlds[k] if w is not None}
        if len(stated) > 1:
            return False  # ranks disagree on the world: not provable
        world = next(iter(stated)) if stated else self.world_size
        return world is not None and self.passed[k] >= set(range(world))


def good_steps(
    checks: tuple[str, ...],
    alert_step: int,
    records: Iterable[CheckRecord | Mapping[str, Any]],
    *,
    world_size: int | None = None,
) -> dict[str, set[int]]:
    """For each check: the steps < alert_step of `records` that are all-rank passes (`_Evidence`). Pure:
    the inputs are check records (typed, or JSON objects read as such)."""
    ev = _Evidence(checks, world_size)
    ev.add(records)
    return {c: {s for s in ev.steps[c] if s < alert_step and ev.all_passed(c, s)} for c in checks}


def last_known_good(
    checks: tuple[str, ...],
    alert_step: int,
    records: Sequence[CheckRecord | Mapping[str, Any]],
    manifests: Sequence[Mapping[str, Any]] = (),
    *,
    world_size: int | None = None,
) -> dict[str, tuple[int | None, str]]:
    """For each check: (newest step < alert_step at which every rank passed and none failed, where that
    came from), from every record given (`good_steps`). `manifests` are not evidence (kept for callers;
    see the module docstring)."""
    del manifests  # a manifest's coverage is one rank's claim, not every rank's record
    good = good_steps(checks, alert_step, records, world_size=world_size)
    return {c: _lkg(max(good[c], default=None)) for c in checks}


def _lkg(step: int | None) -> tuple[int | None, str]:
    return (step, "check records of every rank") if step is not None else (None, NO_PASS)


NO_PASS = "no all-rank pass before the alert"


@dataclass(slots=True)
class Scan:
    """What `scan_last_known_good` found and what it read, for the pick's record and for the bench."""

    last_known_good: dict[str, tuple[int | None, str]]
    windows_listed: int = 0
    batches_read: int = 0


def scan_last_known_good(
    store: ObjectStore,
    run: str,
    checks: tuple[str, ...],
    alert_step: int,
    *,
    world_size: int | None = None,
    floor: int,
) -> Scan:
    """`last_known_good` over the run's check batches, reading only those near the alert: the same
    answer, at a cost that does not grow with the age of the run.

    Batch keys are listed a window of schema.CHECK_BATCH_WINDOW steps at a time, newest first, and the
    batches are read newest last step first. A step is decided once every batch that can hold it has been
    read: no batch spans more than schema.CHECK_BATCH_MAX_SPAN steps (a longer one is no evidence, for
    every reader), so after listing down to window start `lo`, every batch holding a step at or past
    lo + MAX_SPAN - 1 is listed; and after reading every listed batch whose last step is at or past t,
    every step at or past t is whole. A check's last known good step is final as soon as one decided step
    is good: every newer step was decided too, and was not.

    `floor`: the oldest step the caller needs decided (the pick: its oldest promoted checkpoint). Once
    every step at or past it is decided and a check still has no good step, no checkpoint can be picked
    whatever older records say, so the scan stops and that check reads (None, why).

    Why one function: its three moves (list a window, read the newest batches, decide steps) share one
    invariant, what is listed, read and decided so far; split, each part would have to carry all of it."""
    window, span = schema.CHECK_BATCH_WINDOW, schema.CHECK_BATCH_MAX_SPAN
    top = alert_step - 1  # the newest step that can count
    if top >= schema.CHECK_BATCH_STEP_LIMIT:  # keys past 8 digits do not sort into windows
        batches = catalog.check_batches(store, run)
        records = [r for b in batches for r in catalog.read_check_batch(store, b)]
        return Scan(last_known_good(checks, alert_step, records, world_size=world_size), 1, len(batches))
    scan = Scan({})
    ev = _Evidence(checks, world_size)
    found: dict[str, int] = {}
    lo = max(top, 0) // window * window + window  # the lowest window listed so far (none yet)
    unread: list[catalog.CheckBatch] = []  # listed, not read; sorted by last step, newest at the end
    undecided_below = alert_step  # every step from here to the alert is decided
    while True:
        # Only batches listed so far can hold a step at or past `listed_from`.
        listed_from = 0 if lo == 0 else lo + span - 1
        decided_from = max(listed_from, unread[-1].last + 1 if unread else 0)
        if decided_from < undecided_below:
            for c in checks:
                if c not in found:
                    newly = [
                        s for s in ev.steps[c] if decided_from <= s < undecided_below and ev.all_passed(c, s)
                    ]
                    if newly:
                        found[c] = max(newly)
            undecided_below = decided_from
        everything_read = top < 0 or (lo == 0 and not unread)
        if len(found) == len(checks) or everything_read:
            scan.last_known_good = {c: _lkg(found.get(c)) for c in checks}
            return scan
        if decided_from <= floor:
            why = f"no all-rank pass from step {decided_from} to the alert, and nothing older is needed"
            scan.last_known_good = {c: _lkg(found[c]) if c in found else (None, why) for c in checks}
            return scan
        if lo > 0 and (not unread or unread[-1].last < listed_from):
            lo -= window
            scan.windows_listed += 1
            unread += [b for b in catalog.check_batches_in_window(store, run, lo) if b.first <= top]
            unread.sort(key=lambda b: b.last)
            continue
        # Read every unread batch with the newest last step (one per rank: the ranks flush together).
        newest = unread[-1].last
        while unread and unread[-1].last == newest:
            ev.add(catalog.read_check_batch(store, unread.pop()))
            scan.batches_read += 1


def _newest_usable(
    store: ObjectStore,
    run: str,
    promoted: Sequence[int],
    bound: int,
    have: Mapping[int, catalog.Checkpoint],
    rejected: list[str],
) -> int | None:
    """The newest promoted step at or before `bound` whose checkpoint is present (`have`, by step), not
    suspect, and whose newest validation passed; each newer one passed over is added to `rejected`, with why."""
    for s in sorted(promoted, reverse=True):
        if s > bound:
            continue
        if s not in have:
            rejected.append(f"{s}: manifest missing or unreadable")
            continue
        mark = catalog.suspect_mark_for(store, run, s, have[s].manifest.time)
        if mark is not None:
            rejected.append(f"{s}: suspect (after step {mark.after_step})")
            continue
        try:
            latest = catalog.latest_validation(store, run, s)
        except ValueError as e:  # it may be the newest: never pick past it
            rejected.append(f"{s}: a validation does not read ({e})")
            continue
        if latest is None or not latest[1].ok:
            rejected.append(f"{s}: newest validation {'missing' if latest is None else 'failed'}")
            continue
        return s
    return None


def checks_bounding(
    check: str, checks_run: Collection[str] | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the checks whose last known-good step bounds the pick after an alert of `check`, those of its
    class left out because the run does not run them). `checks_run`: what the orchestrator's own launch
    record says the run runs (None: unknown, so every check of the class counts, and a check that never
    ran leaves nothing provable). The alert's own check always counts."""
    klass = tuple(schema.CHECKS_FOR_ALERT[check])
    if checks_run is None:
        return klass, ()
    return (
        tuple(c for c in klass if c == check or c in checks_run),
        tuple(c for c in klass if c != check and c not in checks_run),
    )


def plan_pick(
    store: ObjectStore, run: str, alert: Mapping[str, Any], *, checks_run: Collection[str] | None = None
) -> dict[str, Any]:
    """Work out the pick without writing anything: a dict with `step` (or None), `why`, and the evidence.
    `checks_run`: see `checks_bounding`."""
    check, alert_step = _alert_fields(alert)
    checks, not_run = checks_bounding(check, checks_run)
    cat = catalog.checkpoints(store, run)
    after = catalog.suspect_after(store, run)
    promoted = catalog.promoted_steps(store, run)
    scan = scan_last_known_good(
        store,
        run,
        checks,
        alert_step,
        world_size=AlertRef.from_json(alert).world_size,  # the alert's world, when it names one
        # Nothing older than the oldest promoted checkpoint can change the pick; with none promoted,
        # nothing can, and the last window of steps is read for the record's sake.
        floor=min(promoted, default=max(0, alert_step - schema.CHECK_BATCH_WINDOW)),
    )
    lkg = scan.last_known_good
    have = cat.by_step()
    unknown = [c for c, (s, _src) in lkg.items() if s is None]
    bound = None if unknown else min(s for s, _src in lkg.values() if s is not None)
    lkg_text = ", ".join(f"{c} at step {s} ({src})" for c, (s, src) in lkg.items())
    head = (
        f"alert {check} at step {alert_step} (suspect nodes {list(alert.get('suspect_nodes') or [])}); "
        f"checks able to catch this fault class: {', '.join(checks)}"
        + (f" (not run by this run, so no bound: {', '.join(not_run)})" if not_run else "")
        + f"; last known good: {lkg_text}"
    )
    rejected: list[str] = []
    step: int | None = None
    if bound is not None:
        step = _newest_usable(store, run, promoted, bound, have, rejected)
    if bound is None:
        why = f"{head}; no checkpoint is provably from before the fault: {', '.join(unknown)} never passed on every rank before it"
        if any(src != NO_PASS for c, (_s, src) in lkg.items() if c in unknown):
            why += " (as far back as any checkpoint could be picked)"
    elif step is None:
        why = (
            f"{head}; bound: step {bound}; promoted {promoted}; no promoted checkpoint at or before step {bound}"
            + (f" qualifies ({'; '.join(rejected)})" if rejected else "")
        )
    else:
        why = f"{head}; bound: step {bound}; promoted {promoted}; chose step {step}, the newest promoted at or before it"
        if rejected:
            why += f" (passed over {'; '.join(rejected)})"
    return {
        "step": step,
        "why": why,
        "bound": bound,
        "last_known_good": {c: s for c, (s, _src) in lkg.items()},
        "promoted": promoted,
        "suspect_after": after,
        "rejected": rejected,
        "check_windows_listed": scan.windows_listed,
        "check_batches_read": scan.batches_read,
        "key": schema.store_key(run, schema.checkpoint_dir(step)) if step is not None else None,
    }


def pick_pre_incident(
    store: ObjectStore,
    run: str,
    alert: Mapping[str, Any],
    *,
    write: bool = True,
    checks_run: Collection[str] | None = None,
) -> tuple[int | None, str]:
    """(step, why): the checkpoint to restart from after `alert` (a record with `check`, `step`, and
    `suspect_nodes`), None when there is none. With `write`, the choice is recorded under picks/.
    `checks_run`: see `checks_bounding`."""
    plan = plan_pick(store, run, alert, checks_run=checks_run)
    if write:
        _check, alert_step = _alert_fields(alert)
        rec = schema.record(
            "pick",
            run=run,
            alert=dict(alert),
            step=plan["step"],
            why=plan["why"],
            bound=plan["bound"],
            last_known_good=plan["last_known_good"],
            key=plan["key"],
        )
        ident = f"{int(time.time())}-{uuid.uuid4().hex[:8]}"
        put_json(store, schema.store_key(run, schema.pick_path(alert_step, ident)), rec, if_none_match=True)
    return plan["step"], plan["why"]
