"""Retention: which checkpoints to keep, and deleting the rest.

Kept: the last `keep` promoted checkpoints (by promotion order) and the one the pointer names; every
checkpoint newer than the newest promoted one (still on its way through validation); for every incident
that is not closed, the checkpoint it chose (or the pick would choose now) and the `keep` promoted ones
before it (in case that one is found bad too); an incident record that does not read as one (not even
JSON) counts as not closed (retention never deletes on a status it cannot read), and one whose choice and
alert step do not read either holds every promoted checkpoint; a promotion history entry that does not
read stops retention (`plan_retention` raises naming its key: it may name a checkpoint to keep).
Deleted: other complete checkpoints older than the newest promoted one, and incomplete directories (no
manifest: interrupted uploads) older than the newest complete checkpoint. A directory whose manifest does not parse is reported and left alone.

A checkpoint is deleted manifest first, so a half-deleted one is never a checkpoint.
"""

from __future__ import annotations

from typing import Any

from longrun.checkpoints import catalog
from longrun.checkpoints.pick import plan_pick
from training.records import schema
from training.records.alert import AlertRef
from training.records.incident import RestartCheckpoint
from training.store.interface import ObjectStore

#: Incident statuses after which an incident needs no checkpoint kept for it.
CLOSED_STATUSES = ("closed", "resolved", "rejected")


def plan_retention(store: ObjectStore, run: str, *, keep: int) -> dict[str, Any]:
    """What retention would do: {"keep": {step: reason}, "delete": [step], "incomplete": [prefix],
    "unparsable": [key]}. Writes nothing."""
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep={keep!r}: expected an int >= 1")
    cat = catalog.checkpoints(store, run)
    steps = sorted(c.step for c in cat.checkpoints)
    history = catalog.promotion_history(store, run)
    cur = catalog.current_pointer(store, run)
    order: list[int] = []
    for rec in [*history, *([cur[0]] if cur else [])]:
        if rec.step in order:
            order.remove(rec.step)
        order.append(rec.step)
    kept: dict[int, str] = {}
    for s in order[-keep:]:
        kept[s] = f"among the last {keep} promoted"
    if cur is not None:
        kept[cur[0].step] = "the promoted pointer names it"
    newest_promoted = max(order, default=-1)
    for s in steps:
        if s > newest_promoted:
            kept.setdefault(s, "newer than the newest promoted (not yet through validation)")
    promoted_sorted = sorted(set(order))
    unreadable: list[catalog.Problem] = []
    held_for: list[tuple[str, int | None, Any]] = []  # (incident, its choice, its alert as stored)
    for _key, inc in catalog.incidents(store, run, problems=unreadable):
        if inc.status not in CLOSED_STATUSES:
            held_for.append((inc.incident_id, inc.checkpoint.step, inc.alert))
    for p in unreadable:  # its status is unknown: held as an open incident, with its choice if that reads
        raw = p.record if isinstance(p.record, dict) else {}
        held_for.append((str(raw.get("incident_id") or p.key), _chosen_if_it_reads(raw), raw.get("alert")))
    for ident, chosen, alert in held_for:
        if chosen is None and isinstance(alert, dict):
            try:
                chosen = plan_pick(store, run, alert)["step"]
            except ValueError:
                chosen = None
        if chosen is None:
            # Nothing chosen and nothing provable: keep every promoted checkpoint before the alert, or
            # every promoted one when the alert's step does not read either.
            alert_step = AlertRef.from_json(alert).step  # the incident's copy: free-form
            held = [s for s in promoted_sorted if alert_step is None or s <= alert_step]
        else:
            held = [chosen, *[s for s in promoted_sorted if s < chosen][-keep:]]
        for s in held:
            kept.setdefault(s, f"open incident {ident} may need it")
    delete = [s for s in steps if s not in kept and s < newest_promoted]
    newest_complete = max(steps, default=-1)
    incomplete = [
        p.key
        for p in cat.problems
        if p.error.startswith("incomplete") and _step_of_prefix(p.key) < newest_complete
    ]
    unparsable = [p.key for p in cat.problems if not p.error.startswith("incomplete")]
    return {"keep": kept, "delete": delete, "incomplete": incomplete, "unparsable": unparsable}


def _chosen_if_it_reads(raw: dict[str, Any]) -> int | None:
    """The restart step an incident record that does not read as a whole says it chose, or None."""
    try:
        return RestartCheckpoint.read_or_empty("incident", raw, "checkpoint").step
    except ValueError:
        return None


def _step_of_prefix(prefix: str) -> int:
    return int(prefix.rstrip("/").rsplit("step-", 1)[1])


def _delete_prefix(store: ObjectStore, prefix: str) -> int:
    keys = [i.key for i in store.list(prefix)]
    manifest = [k for k in keys if k.endswith("/manifest.json")]
    for k in manifest + [k for k in keys if k not in manifest]:
        store.delete(k)
    return len(keys)


def apply_retention(store: ObjectStore, run: str, *, keep: int, dry_run: bool = False) -> dict[str, Any]:
    """Plan, then (unless `dry_run`) delete. Returns the plan with `deleted_objects`."""
    plan = plan_retention(store, run, keep=keep)
    deleted = 0
    if not dry_run:
        for s in plan["delete"]:
            deleted += _delete_prefix(store, schema.store_key(run, schema.checkpoint_dir(s)))
        for prefix in plan["incomplete"]:
            deleted += _delete_prefix(store, prefix)
    plan["deleted_objects"] = deleted
    return plan
