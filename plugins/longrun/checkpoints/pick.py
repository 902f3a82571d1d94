"""The pre-incident pick: which checkpoint to restart from after an alert, and why.

Rule: the newest promoted checkpoint whose step is at or before the last step known good by every check
that could have caught this fault class (`schema.CHECKS_FOR_ALERT[alert check]`). A check's last
known-good step is the newest step before the alert's at which it passed and did not fail on any rank,
from the run's check records (checks/*.jsonl) and the coverage the manifests recorded at save time. A
suspect checkpoint (after a demotion mark) and one whose newest validation did not pass are never picked.
When no check in the class has ever passed before the alert, nothing is provably from before the fault
and the pick is None.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from longrun.checkpoints import catalog
from training import schema
from training.store import ObjectStore, put_json


def _alert_fields(alert: Mapping[str, Any]) -> tuple[str, int]:
    check = alert.get("check")
    step = alert.get("step")
    if check not in schema.CHECKS_FOR_ALERT:
        raise ValueError(f"alert check {check!r}: expected one of {sorted(schema.CHECKS_FOR_ALERT)}")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"alert step {step!r}: expected an int >= 0")
    return str(check), step


def last_known_good(
    checks: tuple[str, ...],
    alert_step: int,
    records: Sequence[Mapping[str, Any]],
    manifests: Sequence[Mapping[str, Any]],
) -> dict[str, tuple[int | None, str]]:
    """For each check: (newest step < alert_step at which it passed and did not fail, where that came
    from). Pure: the inputs are check records and manifests."""
    passed: dict[str, set[int]] = {c: set() for c in checks}
    failed: dict[str, set[int]] = {c: set() for c in checks}
    for r in records:
        c = r.get("check")
        if c not in passed or not isinstance(r.get("step"), int):
            continue
        if r.get("verdict") == "pass":
            passed[c].add(r["step"])
        elif r.get("verdict") == "fail":
            failed[c].add(r["step"])
    from_manifest: dict[str, set[int]] = {c: set() for c in checks}
    for m in manifests:
        cov = m.get("coverage")
        if not isinstance(cov, Mapping):
            continue
        for c in checks:
            s = cov.get(c)
            if isinstance(s, int) and not isinstance(s, bool):
                from_manifest[c].add(s)
    out: dict[str, tuple[int | None, str]] = {}
    for c in checks:
        rec_steps = {s for s in passed[c] if s < alert_step} - failed[c]
        man_steps = {s for s in from_manifest[c] if s < alert_step} - failed[c]
        best_rec = max(rec_steps, default=None)
        best_man = max(man_steps, default=None)
        if best_rec is None and best_man is None:
            out[c] = (None, "no pass before the alert")
        elif best_man is None or (best_rec is not None and best_rec >= best_man):
            out[c] = (best_rec, "check records")
        else:
            out[c] = (best_man, "manifest coverage")
    return out


def plan_pick(store: ObjectStore, run: str, alert: Mapping[str, Any]) -> dict[str, Any]:
    """Work out the pick without writing anything: a dict with `step` (or None), `why`, and the evidence."""
    check, alert_step = _alert_fields(alert)
    checks = tuple(schema.CHECKS_FOR_ALERT[check])
    cat = catalog.checkpoints(store, run)
    manifests = [c.manifest for c in cat.checkpoints]
    lkg = last_known_good(checks, alert_step, list(catalog.check_records(store, run)), manifests)
    after = catalog.suspect_after(store, run)
    promoted = catalog.promoted_steps(store, run)
    have = cat.by_step()
    unknown = [c for c, (s, _src) in lkg.items() if s is None]
    bound = None if unknown else min(s for s, _src in lkg.values() if s is not None)
    lkg_text = ", ".join(f"{c} at step {s} ({src})" for c, (s, src) in lkg.items())
    head = (
        f"alert {check} at step {alert_step} (suspect nodes {list(alert.get('suspect_nodes') or [])}); "
        f"checks able to catch this fault class: {', '.join(checks)}; last known good: {lkg_text}"
    )
    rejected: list[str] = []
    step: int | None = None
    if bound is not None:
        for s in sorted(promoted, reverse=True):
            if s > bound:
                continue
            if s not in have:
                rejected.append(f"{s}: manifest missing or unreadable")
                continue
            mark = catalog.suspect_mark_for(store, run, s, have[s].manifest.get("time"))
            if mark is not None:
                rejected.append(f"{s}: suspect (after step {mark['after_step']})")
                continue
            v = catalog.latest_validation(store, run, s)
            if v is None or not v["ok"]:
                rejected.append(f"{s}: newest validation {'missing' if v is None else 'failed'}")
                continue
            step = s
            break
    if bound is None:
        why = f"{head}; no checkpoint is provably from before the fault: {', '.join(unknown)} never passed before it"
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
    store: ObjectStore, run: str, alert: Mapping[str, Any], *, write: bool = True
) -> tuple[int | None, str]:
    """(step, why): the checkpoint to restart from after `alert` (a record with `check`, `step`, and
    `suspect_nodes`), None when there is none. With `write`, the choice is recorded under picks/."""
    plan = plan_pick(store, run, alert)
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
