"""The pre-incident pick across alert kinds: the pure rule, then end to end on both stores."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ckpt_helpers import Saver
from helpers.check_batches import put_check_batches
from longrun.checkpoints import catalog
from longrun.checkpoints.pick import last_known_good, pick_pre_incident, plan_pick
from longrun.checkpoints.promote import mark_suspect, promote
from longrun.checkpoints.validate import validate

from training.records import schema
from training.store.interface import ObjectStore


def _rec(
    check: str, step: int, verdict: str = "pass", rank: int = 0, world: int | None = 3
) -> dict[str, Any]:
    extra = {} if world is None else {"world_size": world}
    return schema.record(
        "check", run="r", step=step, check=check, verdict=verdict, rank=rank, duration_s=0.001, **extra
    )


def _history(last: int = 50) -> list[dict[str, Any]]:
    """finite every step, recompute and weight_vote every 10 steps, on ranks 0-2."""
    recs = []
    for step in range(1, last + 1):
        for rank in range(3):
            recs.append(_rec("finite", step, rank=rank))
            if step % 10 == 0:
                recs.append(_rec("recompute", step, rank=rank))
                recs.append(_rec("weight_vote", step, rank=rank))
    return recs


@pytest.mark.parametrize(
    ("check", "alert_step", "expected"),
    [
        # faults between audits leave no trace: back to the last audit
        ("recompute", 37, {"recompute": 30, "weight_vote": 30}),
        ("recompute", 30, {"recompute": 20, "weight_vote": 20}),  # the checks at the alert's own step
        # A finite alert is bounded by the checks that see finite wrong values, not by the finite check.
        ("finite", 37, {"finite": 36, "recompute": 30, "weight_vote": 30}),
        ("weight_vote", 45, {"weight_vote": 40, "recompute": 40}),
        ("weight_vote", 5, {"weight_vote": None, "recompute": None}),  # never passed before the alert
    ],
)
def test_last_known_good_per_alert_kind(check: str, alert_step: int, expected: dict[str, int | None]) -> None:
    checks = schema.CHECKS_FOR_ALERT[check]
    got = {c: s for c, (s, _src) in last_known_good(checks, alert_step, _history(), []).items()}
    assert got == expected


def test_a_failure_on_any_rank_is_not_a_pass() -> None:
    recs = [*_history(), _rec("recompute", 30, "fail", rank=2)]
    [(step, src)] = last_known_good(("recompute",), 37, recs, []).values()
    assert (step, src) == (20, "check records of every rank")


def test_a_rank_with_no_record_is_not_a_pass() -> None:
    recs = [r for r in _history() if not (r["check"] == "recompute" and r["step"] == 30 and r["rank"] == 1)]
    assert last_known_good(("recompute",), 37, recs)["recompute"][0] == 20
    # Records that do not state their world count only against the alert's world.
    bare = [_rec("recompute", 10, rank=r, world=None) for r in range(2)]
    assert last_known_good(("recompute",), 37, bare)["recompute"][0] is None
    assert last_known_good(("recompute",), 37, bare, world_size=3)["recompute"][0] is None
    assert last_known_good(("recompute",), 37, bare, world_size=2)["recompute"][0] == 10


def test_a_check_record_that_does_not_read_is_no_evidence() -> None:
    """The pick reads check records as typed records: one with a malformed field (a world size as text,
    a rank list of strings) vouches for nothing, so it can only make the pick older, never newer."""
    good = [_rec("recompute", 10, rank=r) for r in range(3)]
    assert last_known_good(("recompute",), 37, good)["recompute"][0] == 10
    text_world = [*good[:2], {**good[2], "world_size": "3"}]
    assert last_known_good(("recompute",), 37, text_world, world_size=3)["recompute"][0] is None
    bad_suspects = [*good[:2], {**good[2], "suspect_ranks": ["1"]}]
    assert last_known_good(("recompute",), 37, bad_suspects)["recompute"][0] is None


def test_a_finite_alert_is_not_bounded_by_the_finite_check_alone(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    _setup(store, run, save_checkpoints, [10, 20, 30, 40], promoted=[10, 20, 30, 40])
    # NaN at 41; the last recompute/vote on every rank was at 40 (no pass since). Before: bound 40 via the
    # finite check; rank 2's audit at 40 is missing now, so the bound is 30.
    lines = [
        json.dumps({**r, "run": run})
        for r in _history()
        if not (r["step"] == 40 and r["rank"] == 2 and r["check"] != "finite")
    ]
    put_check_batches(store, run, [json.loads(line) for line in lines])
    step, why = pick_pre_incident(
        store, run, {"check": "finite", "step": 41, "suspect_nodes": ["n2"]}, write=False
    )
    assert step == 30, why


def test_manifest_coverage_alone_is_not_a_pass() -> None:
    manifests = [{"coverage": {"recompute": s, "finite": s}} for s in (10, 20, 30)]
    [(step, _src)] = last_known_good(("recompute",), 37, [], manifests).values()
    assert step is None


def _setup(store: ObjectStore, run: str, save: Saver, steps: list[int], promoted: list[int]) -> None:
    save(store, run, steps, coverage=lambda s: {"finite": s, "recompute": s, "weight_vote": s})
    for s in steps:
        assert validate(store, run, s)["ok"]
    for s in promoted:
        promote(store, run, s)
    put_check_batches(store, run, [{**r, "run": run} for r in _history()])


def test_pick_end_to_end_across_alert_kinds(store: ObjectStore, run: str, save_checkpoints: Saver) -> None:
    _setup(store, run, save_checkpoints, [10, 20, 30, 40], promoted=[10, 20, 40])  # 30 never promoted
    cases = {
        ("recompute", 37): 20,  # bound 30, 30 not promoted -> 20
        ("recompute", 45): 40,
        ("finite", 41): 40,
        ("weight_vote", 40): 20,  # the vote at 40 failed: bound 30
    }
    for (check, step), want in cases.items():
        got, why = pick_pre_incident(store, run, {"check": check, "step": step, "suspect_nodes": ["n2"]})
        assert got == want, why
        assert f"alert {check} at step {step}" in why and f"chose step {want}" in why and "n2" in why
    picks = list(store.list(schema.store_key(run, "picks/")))
    assert len(picks) == len(cases)
    rec = json.loads(store.get_bytes(picks[0].key))
    schema.validate("pick", rec)


def test_pick_never_takes_a_suspect_or_unvalidated_checkpoint(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    _setup(store, run, save_checkpoints, [10, 20, 30, 40], promoted=[10, 20, 30, 40])
    alert = {"check": "recompute", "step": 45, "suspect_nodes": []}
    assert plan_pick(store, run, alert)["step"] == 40
    mark_suspect(store, run, 25, "earlier incident")
    plan = plan_pick(store, run, alert)
    assert plan["step"] == 20 and plan["suspect_after"] == 25
    # Corrupt 20 after promotion; its newest validation now fails, so it is passed over.
    key = schema.store_key(run, schema.checkpoint_dir(20) + "model.pt")
    data = store.get_bytes(key)
    store.put_bytes(key, data[:10] + bytes([data[10] ^ 0xFF]) + data[11:])
    assert not validate(store, run, 20)["ok"]
    step, why = pick_pre_incident(store, run, alert, write=False)
    assert step == 10 and "20: newest validation failed" in why


def test_pick_never_takes_a_checkpoint_whose_newest_validation_does_not_read(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    """40 passed its validation; a newer one of 40 that is not JSON is never skipped (the older pass
    would make 40 the pick): 40 is passed over, naming the key, and 30 is picked."""
    _setup(store, run, save_checkpoints, [10, 20, 30, 40], promoted=[10, 20, 30, 40])
    alert = {"check": "recompute", "step": 45, "suspect_nodes": []}
    assert plan_pick(store, run, alert)["step"] == 40
    key = schema.store_key(run, schema.validation_path(40, "9999999999-garbled"))
    store.put_bytes(key, b'{"kind": "validation", "ok": tr')
    step, why = pick_pre_incident(store, run, alert, write=False)
    assert step == 30 and f"40: a validation does not read ({key}" in why, why


def test_no_pick_when_no_check_in_the_class_ever_passed(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    save_checkpoints(store, run, [10])
    assert validate(store, run, 10)["ok"]
    promote(store, run, 10)
    step, why = pick_pre_incident(store, run, {"check": "recompute", "step": 30, "suspect_nodes": []})
    assert step is None and "recompute, weight_vote never passed on every rank" in why
    assert catalog.current_pointer(store, run) is not None


def test_pick_rejects_a_bad_alert(store: ObjectStore, run: str) -> None:
    with pytest.raises(ValueError, match="alert check"):
        plan_pick(store, run, {"check": "vibes", "step": 3})
    with pytest.raises(ValueError, match="alert step"):
        plan_pick(store, run, {"check": "finite", "step": "3"})


def test_pick_reads_the_alerts_world_from_its_evidence(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    _setup(store, run, save_checkpoints, [10, 20, 30, 40], promoted=[10, 20, 40])
    # check records that do not state their world: only the alert's world says which ranks make a pass
    bare = [{k: v for k, v in r.items() if k != "world_size"} | {"run": run} for r in _history()]
    put_check_batches(store, run, bare)
    alert = {"check": "recompute", "step": 37, "suspect_nodes": ["n2"]}

    def pick(world: Any) -> int | None:
        return plan_pick(store, run, {**alert, "evidence": {"world": world}})["step"]

    assert pick({"world_size": 3, "nodes": ["n1", "n2", "n3"]}) == 20
    assert pick({"world_size": 4}) is None  # rank 3 never passed: nothing provable
    assert plan_pick(store, run, alert)["step"] is None  # no world named: nothing provable
    for odd in ({"world_size": "3"}, {"world_size": 3.0}, {"world_size": True}, {"size": 3}, "3", None):
        assert pick(odd) is None  # a world that does not read names no world
    assert plan_pick(store, run, {**alert, "evidence": [3]})["step"] is None


def test_a_check_the_run_does_not_run_bounds_nothing_when_the_launch_record_says_so(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    """A run without the recompute (its cadence 0, or a sharded run): without the launch's checks every check
    of the class counts and a weight-vote alert restarts from step 0; with them the vote's passes bound the
    pick. The alert's own check counts even when the launch record leaves it out."""
    save_checkpoints(store, run, [10, 20], coverage=lambda s: {"finite": s, "weight_vote": s})
    for s in (10, 20):
        assert validate(store, run, s)["ok"]
        promote(store, run, s)
    no_recompute = [r for r in _history(30) if r["check"] != "recompute"]
    put_check_batches(store, run, [{**r, "run": run} for r in no_recompute])
    alert = {"check": "weight_vote", "step": 25, "suspect_nodes": ["n3"]}
    step, why = pick_pre_incident(store, run, alert, write=False)
    assert step is None and "recompute never passed on every rank" in why
    step, why = pick_pre_incident(store, run, alert, write=False, checks_run=("finite", "weight_vote"))
    assert step == 20 and "not run by this run, so no bound: recompute" in why, why
    assert plan_pick(store, run, alert, checks_run=("finite",))["last_known_good"] == {"weight_vote": 20}
