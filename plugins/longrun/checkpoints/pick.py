"""The pre-incident pick: which checkpoint to restart from after an alert, and why.

Rule: the newest promoted checkpoint whose step is at or before the last step known good by the check
that fired and by every check able to see a finite wrong value (`schema.CHECKS_FOR_ALERT[alert check]`:
a node may produce finite wrong numbers before its first NaN, so a finite alert is bounded by the
recompute audit and the weight vote too). A check's last known-good step is the newest step before the
alert's at which EVERY rank of that step's world recorded a pass and none a failure, from the run's check
records (checks/*.jsonl, one batch file per rank). A rank with no record is not a pass; neither is a
record that does not say its world size (when the alert does not say it either), nor the coverage a
manifest claims (one rank's view). A suspect checkpoint (after a demotion mark) and one whose newest
validation did not pass are never picked. When a check in the class has no all-rank pass before the
alert, nothing is provably from before the fault and the pick is None.

A check the run does not run (the orchestrator's own launch record says so: a recompute cadence of 0, or a
sharded run, whose recompute and, under FSDP2, vote do not exist) bounds nothing: it leaves the class,
and the pick rests on the checks that ran. Without that record every check of the class counts, and a run
that never ran one of them restarts from step 0. The pick is then as strong as the checks the run chose
(docs/checkpoints.md, docs/sharding.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
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


def last_known_good(
    checks: tuple[str, ...],
    alert_step: int,
    records: Sequence[CheckRecord | Mapping[str, Any]],
    manifests: Sequence[Mapping[str, Any]] = (),
    *,
    world_size: int | None = None,
) -> dict[str, tuple[int | None, str]]:
    """For each check: (newest step < alert_step at which every rank passed and none failed, where that
    came from). A step's world is the `world_size` its records state (they must agree), else the
    `world_size` given (the alert's). `manifests` are not evidence (kept for callers; see the module
    docstring). Pure: the inputs are check records (typed, or JSON objects read as such)."""
    del manifests  # a manifest's coverage is one rank's claim, not every rank's record
    passed: dict[tuple[str, int], set[int]] = {}
    failed: set[tuple[str, int]] = set()
    worlds: dict[tuple[str, int], set[int | None]] = {}
    for r in _check_records(records):
        if r.check not in checks or not _is_index(r.step) or not _is_index(r.rank):
            continue  # negative
        k = (r.check, r.step)
        worlds.setdefault(k, set()).add(_world(r.world_size))
        if r.verdict == "pass":
            passed.setdefault(k, set()).add(r.rank)
        elif r.verdict == "fail":
            failed.add(k)
    out: dict[str, tuple[int | None, str]] = {}
    for c in checks:
        good: list[int] = []
        for (check, step), ranks in passed.items():
            if check != c or step >= alert_step or (check, step) in failed:
                continue
            stated = {w for w in worlds[(check, step)] if w is not None}
            if len(stated) > 1:
                continue  # ranks disagree on the world: not provable
            world = next(iter(stated)) if stated else world_size
            if world is not None and ranks >= set(range(world)):
                good.append(step)
        best = max(good, default=None)
        out[c] = (
            (best, "check records of every rank")
            if best is not None
            else (None, "no all-rank pass before the alert")
        )
    return out


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
    lkg = last_known_good(
        checks,
        alert_step,
        list(catalog.check_records(store, run)),
        world_size=AlertRef.from_json(alert).world_size,  # the alert's world, when it names one
    )
    after = catalog.suspect_after(store, run)
    promoted = catalog.promoted_steps(store, run)
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
