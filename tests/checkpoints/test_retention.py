"""Retention: the last K promoted, in-flight ones, and what open incidents need are kept."""

from __future__ import annotations

import pytest
from ckpt_helpers import Saver
from longrun.checkpoints import catalog
from longrun.checkpoints.promote import promote
from longrun.checkpoints.retention import apply_retention, plan_retention
from longrun.checkpoints.validate import validate

from training.records import schema
from training.store.interface import ObjectStore, put_json


def _setup(store: ObjectStore, run: str, save: Saver) -> None:
    steps = [10, 20, 30, 40, 50, 60]
    save(store, run, steps, coverage=lambda s: {"recompute": s, "finite": s, "weight_vote": s})
    for s in steps[:-1]:
        assert validate(store, run, s)["ok"]
        promote(store, run, s)
    # An interrupted upload before the newest checkpoint, one in flight after it, a torn manifest.
    store.put_bytes(schema.store_key(run, schema.checkpoint_dir(25) + "model.pt"), b"partial")
    store.put_bytes(schema.store_key(run, schema.checkpoint_dir(70) + "model.pt"), b"uploading")
    store.put_bytes(schema.store_key(run, schema.manifest_path(35)), b"{torn")


def _incident(store: ObjectStore, run: str, status: str, **more: object) -> None:
    alert = {"check": "recompute", "step": 27, "suspect_nodes": ["n3"]}
    fields = {"timeline": [], **more}
    rec = schema.record(
        "incident", run=run, incident_id="inc-27", alert=alert, mode="act", status=status, **fields
    )
    put_json(store, schema.store_key(run, schema.incident_path("inc-27")), rec)


def _steps_in_store(store: ObjectStore, run: str) -> set[int]:
    out = set()
    for info in store.list(schema.store_key(run, "checkpoints/")):
        out.add(int(info.key.split("step-")[1][:8]))
    return out


def test_keeps_last_k_promoted_and_newer(store: ObjectStore, run: str, save_checkpoints: Saver) -> None:
    _setup(store, run, save_checkpoints)
    plan = plan_retention(store, run, keep=2)
    assert sorted(plan["keep"]) == [40, 50, 60]
    assert plan["delete"] == [10, 20, 30]
    assert [p.rsplit("/", 2)[-2] for p in plan["incomplete"]] == ["step-00000025"]
    assert [k.rsplit("/", 2)[-2] for k in plan["unparsable"]] == ["step-00000035"]
    dry = apply_retention(store, run, keep=2, dry_run=True)
    assert dry["deleted_objects"] == 0 and _steps_in_store(store, run) == {10, 20, 25, 30, 35, 40, 50, 60, 70}
    done = apply_retention(store, run, keep=2)
    assert done["deleted_objects"] > 0
    assert _steps_in_store(store, run) == {35, 40, 50, 60, 70}
    assert [c.step for c in catalog.checkpoints(store, run).checkpoints] == [40, 50, 60]


@pytest.mark.parametrize(("status", "kept_for_incident"), [("open", [10, 20]), ("closed", [])])
def test_an_open_incident_keeps_what_its_pick_needs(
    store: ObjectStore, run: str, save_checkpoints: Saver, status: str, kept_for_incident: list[int]
) -> None:
    _setup(store, run, save_checkpoints)
    _incident(store, run, status)
    plan = plan_retention(store, run, keep=1)
    held = sorted(s for s, why in plan["keep"].items() if "incident inc-27" in why)
    assert held == kept_for_incident  # recompute alert at 27: pick 20, plus the 1 promoted before it
    assert 50 in plan["keep"] and 60 in plan["keep"]


@pytest.mark.parametrize(
    ("more", "kept_for_incident"),
    [
        ({"timeline": [{"time": 1.0}]}, [10, 20]),  # an event without its name: the pick of now
        ({"timeline": [{"time": 1.0}], "checkpoint": {"step": 10, "key": None, "why": "x"}}, [10]),
        ({"checkpoint": {"step": "twenty"}}, [10, 20]),
    ],
    ids=["bad-timeline", "bad-timeline-with-its-choice", "bad-checkpoint"],
)
def test_an_incident_that_does_not_read_keeps_its_checkpoints_whatever_its_status_says(
    store: ObjectStore, run: str, save_checkpoints: Saver, more: dict, kept_for_incident: list[int]
) -> None:
    # Attack: the record says "closed" but does not read as an incident record. Its status is unknown,
    # so it must not free the checkpoints it may need (deleting them cannot be undone).
    _setup(store, run, save_checkpoints)
    _incident(store, run, "closed", **more)
    plan = plan_retention(store, run, keep=1)
    held = sorted(s for s, why in plan["keep"].items() if "incident inc-27" in why)
    assert held == kept_for_incident
    assert not set(kept_for_incident) & set(apply_retention(store, run, keep=1)["delete"])


def test_keep_must_be_positive(store: ObjectStore, run: str) -> None:
    with pytest.raises(ValueError, match="keep"):
        plan_retention(store, run, keep=0)


@pytest.mark.parametrize("garble", ["not-json", "no-step"])
def test_a_history_entry_that_does_not_read_stops_retention(
    store: ObjectStore, run: str, save_checkpoints: Saver, garble: str
) -> None:
    """Skipping promotion 4 (step 40) would make step 30 one of the last 2 promoted and delete step 40,
    which is one of them: an entry that does not read stops retention, naming its key, deleting nothing."""
    _setup(store, run, save_checkpoints)
    key = schema.store_key(run, schema.promotion_history_path(4))
    good = store.get_bytes(key)
    store.put_bytes(key, b"{garbled" if garble == "not-json" else good.replace(b'"step"', b'"stop"'))
    before = _steps_in_store(store, run)
    with pytest.raises(schema.SchemaError, match=key):
        apply_retention(store, run, keep=2)
    assert _steps_in_store(store, run) == before
    store.put_bytes(key, good)
    assert sorted(plan_retention(store, run, keep=2)["keep"]) == [40, 50, 60]


@pytest.mark.parametrize(
    "body",
    [
        b"{garbled",
        b'{"kind": "incident", "status": "closed"}',
        b'{"status": "closed", "alert": {"step": "x"}}',
    ],
    ids=["not-json", "table-refuses", "no-alert-step"],
)
def test_an_incident_with_nothing_readable_keeps_every_promoted_checkpoint(
    store: ObjectStore, run: str, save_checkpoints: Saver, body: bytes
) -> None:
    """An incident record that reads so little that neither its status, its choice nor its alert's step
    is known (before: skipped, or holding nothing) may need any promoted checkpoint: all are kept."""
    _setup(store, run, save_checkpoints)
    key = schema.store_key(run, schema.incident_path("inc-27"))
    store.put_bytes(key, body)
    plan = plan_retention(store, run, keep=1)
    assert sorted(plan["keep"]) == [10, 20, 30, 40, 50, 60] and plan["delete"] == []
    assert sorted(s for s, why in plan["keep"].items() if "may need it" in why) == [10, 20, 30, 40]
    assert apply_retention(store, run, keep=1)["delete"] == []
    store.delete(key)
    assert plan_retention(store, run, keep=1)["delete"] == [10, 20, 30, 40]
