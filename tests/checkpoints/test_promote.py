"""Promotion by conditional write, its history, the race between writers, and demotion."""

from __future__ import annotations

import json
import threading

import pytest
from ckpt_helpers import Saver
from helpers.counting_store import CountingStore
from longrun.checkpoints import catalog
from longrun.checkpoints.promote import (
    PromotionConflict,
    PromotionRefused,
    mark_suspect,
    promote,
    write_pointer,
)
from longrun.checkpoints.validate import validate
from longrun.runview import RunView

from training.records import schema
from training.store.interface import ObjectStore


def _ready(store: ObjectStore, run: str, save: Saver, steps: list[int]) -> None:
    save(store, run, steps)
    for s in steps:
        assert validate(store, run, s)["ok"]


def test_promotion_needs_a_passing_validation(store: ObjectStore, run: str, save_checkpoints: Saver) -> None:
    save_checkpoints(store, run, [10])
    with pytest.raises(PromotionRefused, match="not validated"):
        promote(store, run, 10)
    with pytest.raises(PromotionRefused, match="no manifest"):
        promote(store, run, 99)
    key = schema.store_key(run, schema.checkpoint_dir(10) + "model.pt")
    good = store.get_bytes(key)
    store.put_bytes(key, good[:-1] + bytes([good[-1] ^ 1]))
    assert not validate(store, run, 10)["ok"]
    with pytest.raises(PromotionRefused, match="failed its latest validation: model.pt: sha256"):
        promote(store, run, 10)
    assert catalog.current_pointer(store, run) is None


def test_promotion_refuses_a_manifest_changed_after_validation(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    _ready(store, run, save_checkpoints, [10])
    key = schema.store_key(run, schema.manifest_path(10))
    store.put_bytes(key, store.get_bytes(key) + b"\n")
    with pytest.raises(PromotionRefused, match="changed since it was validated"):
        promote(store, run, 10)


def test_promote_moves_the_pointer_and_keeps_history(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    _ready(store, run, save_checkpoints, [10, 20])
    first = promote(store, run, 10)
    assert first["seq"] == 1 and first["previous_step"] is None
    second = promote(store, run, 20)
    assert second["seq"] == 2 and second["previous_step"] == 10
    assert promote(store, run, 20) == second  # already current: nothing written
    cur = catalog.current_pointer(store, run)
    assert cur is not None and cur[0].to_json() == second
    assert [(r.seq, r.step) for r in catalog.promotion_history(store, run)] == [(1, 10), (2, 20)]
    assert catalog.promoted_steps(store, run) == [10, 20]


def test_a_lost_history_entry_is_backfilled(store: ObjectStore, run: str, save_checkpoints: Saver) -> None:
    _ready(store, run, save_checkpoints, [10, 20])
    promote(store, run, 10)
    store.delete(schema.store_key(run, schema.promotion_history_path(1)))  # its writer died after the pointer
    promote(store, run, 20)
    assert [r.step for r in catalog.promotion_history(store, run)] == [10, 20]


@pytest.mark.parametrize("existing", [False, True], ids=["first", "next"])
def test_two_writers_from_the_same_state_one_wins(
    store: ObjectStore, run: str, save_checkpoints: Saver, existing: bool
) -> None:
    _ready(store, run, save_checkpoints, [10, 20, 30])
    if existing:
        promote(store, run, 10)
    observed = catalog.current_pointer(store, run)
    barrier = threading.Barrier(2)
    outcome: dict[int, object] = {}

    def writer(step: int) -> None:
        barrier.wait(10)
        try:
            outcome[step] = write_pointer(
                store, run, step, schema.store_key(run, schema.manifest_path(step)), observed, reason="test"
            )
        except PromotionConflict as e:
            outcome[step] = e

    threads = [threading.Thread(target=writer, args=(s,)) for s in (20, 30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [s for s, o in outcome.items() if isinstance(o, dict)]
    losers = [s for s, o in outcome.items() if isinstance(o, PromotionConflict)]
    assert len(winners) == 1 and len(losers) == 1, outcome
    cur = catalog.current_pointer(store, run)
    assert cur is not None and cur[0].step == winners[0]
    assert [r.step for r in catalog.promotion_history(store, run)] == ([10] if existing else []) + winners


def test_racing_promotions_never_lose_an_update(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    steps = [10, 20, 30, 40]
    _ready(store, run, save_checkpoints, steps)
    barrier = threading.Barrier(len(steps))
    outcome: dict[int, object] = {}

    def writer(step: int) -> None:
        barrier.wait(10)
        try:
            outcome[step] = promote(store, run, step)
        except PromotionConflict as e:
            outcome[step] = e

    threads = [threading.Thread(target=writer, args=(s,)) for s in steps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    won = sorted((o["seq"], s) for s, o in outcome.items() if isinstance(o, dict))
    assert len(outcome) == len(steps) and won, outcome
    assert [seq for seq, _s in won] == list(range(1, len(won) + 1))  # every win is its own sequence number
    assert [(r.seq, r.step) for r in catalog.promotion_history(store, run)] == won
    cur = catalog.current_pointer(store, run)
    assert cur is not None and cur[0].step == won[-1][1]


def test_demotion_marks_later_checkpoints_suspect_and_moves_the_pointer_back(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    _ready(store, run, save_checkpoints, [10, 20, 30])
    for s in (10, 20, 30):
        promote(store, run, s)
    rec = mark_suspect(store, run, 15, "recompute alert at step 27", incident_id="inc-1")
    assert rec["pointer"] == "moved from step 30 back to step 10"
    cur = catalog.current_pointer(store, run)
    assert cur is not None and cur[0].step == 10 and cur[0].extra["demoted_from"] == 30
    with pytest.raises(PromotionRefused, match="suspect"):
        promote(store, run, 20)
    again = mark_suspect(store, run, 15, "recompute alert at step 27", incident_id="inc-1")
    assert again["pointer"] == "unchanged"
    assert len(catalog.suspect_marks(store, run)) == 1
    assert catalog.suspect_after(store, run) == 15


def test_demotion_without_an_earlier_promotion_leaves_the_pointer(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    _ready(store, run, save_checkpoints, [30])
    promote(store, run, 30)
    rec = mark_suspect(store, run, 5, "finite alert at step 6")
    assert rec["pointer"].startswith("unchanged: it names suspect step 30")


def test_checkpoints_saved_after_a_mark_are_not_suspect(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    _ready(store, run, save_checkpoints, [10, 20])
    promote(store, run, 10)
    promote(store, run, 20)
    assert mark_suspect(store, run, 15, "incident 1", incident_id="inc-1")["pointer"] == (
        "moved from step 20 back to step 10"
    )
    _ready(store, run, save_checkpoints, [30])  # the relaunch, from step 10, saves new steps
    assert promote(store, run, 30)["step"] == 30
    # A later incident whose last known-good step is 35 leaves the relaunch's checkpoint alone...
    assert mark_suspect(store, run, 35, "incident 2", incident_id="inc-2")["pointer"] == "unchanged"
    # ...one at 25 demotes it, and the pointer falls back past the old suspect step 20.
    assert mark_suspect(store, run, 25, "incident 3", incident_id="inc-3")["pointer"] == (
        "moved from step 30 back to step 10"
    )


def test_a_suspect_mark_that_does_not_read_refuses_the_promotion(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    """A mark the table accepts but that does not read as a SuspectMark (here `steps` is not a list of
    ints) is never skipped: the promotion it might forbid is refused, naming the mark's key."""
    _ready(store, run, save_checkpoints, [10])
    mark_suspect(store, run, 50, "a mark that does not demote step 10")
    [info] = list(store.list(schema.store_key(run, "suspect/")))
    bad = {**json.loads(store.get_bytes(info.key)), "steps": "10"}
    store.put_bytes(info.key, json.dumps(bad).encode())
    with pytest.raises(PromotionRefused, match=f"a suspect mark does not read: {info.key}"):
        promote(store, run, 10)
    with pytest.raises(ValueError, match=info.key):
        catalog.suspect_after(store, run)
    store.put_bytes(info.key, json.dumps({**bad, "steps": [50]}).encode())
    assert promote(store, run, 10)["step"] == 10


@pytest.mark.parametrize("garble", ["not-json", "table", "type", "other-step"])
def test_a_newest_validation_that_does_not_read_refuses_the_promotion(
    store: ObjectStore, run: str, save_checkpoints: Saver, garble: str
) -> None:
    """Step 10 has a passing validation; a newer one that does not read is never skipped (the older pass
    would then enable the promotion): the promotion is refused naming its key, and the gate validates
    again but its promotion is refused too. Removed, the promotion goes on."""
    from longrun.monitor.gate import gate_pending

    _ready(store, run, save_checkpoints, [10])
    [info] = list(store.list(schema.store_key(run, "validations/")))
    old_key, old = info.key, json.loads(store.get_bytes(info.key))
    key = schema.store_key(run, schema.validation_path(10, "9999999999-garbled"))
    body = {
        "not-json": b'{"kind": "validation", "ok": fal',
        "table": json.dumps({**old, "ok": "no"}).encode(),  # the table wants a bool
        "type": json.dumps({**old, "ok": False, "manifest_etag": 5}).encode(),
        "other-step": json.dumps({**old, "ok": False, "step": 11}).encode(),
    }[garble]
    store.put_bytes(key, body)
    with pytest.raises(PromotionRefused, match=f"a validation does not read: {key}"):
        promote(store, run, 10)
    assert catalog.current_pointer(store, run) is None

    class Log:
        def __getattr__(self, _name: str) -> object:
            return lambda *a, **k: None

    [gated] = gate_pending(store, run, before_step=11, log=Log(), by="test")
    assert gated["validated"] and key in gated["refused"]
    assert catalog.current_pointer(store, run) is None

    store.delete(key)
    assert promote(store, run, 10)["step"] == 10
    assert old_key != key


def test_a_suspect_mark_that_is_not_json_refuses_the_promotion(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    """Before, a mark that was not JSON was skipped, so the checkpoints it might demote could be promoted."""
    _ready(store, run, save_checkpoints, [10])
    key = schema.store_key(run, schema.suspect_path("00000005-garbled"))
    store.put_bytes(key, b'{"kind": "suspect", "after_step": 5')
    with pytest.raises(PromotionRefused, match=f"a suspect mark does not read: {key}"):
        promote(store, run, 10)
    store.delete(key)
    assert promote(store, run, 10)["step"] == 10


def _promote_all(store: ObjectStore, run: str, save: Saver, steps: list[int]) -> None:
    _ready(store, run, save, steps)
    for s in steps:
        promote(store, run, s)


def test_promoted_steps_are_one_listing_whatever_the_number_of_promotions(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    """The pick, the monitor, the demotion and the run report ask for the promoted steps; they used to read
    one history entry per promotion (growing with the age of the run, on the incident's critical path).
    Now: the pointer and one listing of the step index, at 2 promotions as at 6."""
    counted = []
    for steps in ([10, 20], [30, 40, 50, 60]):
        _promote_all(store, run, save_checkpoints, steps)
        counting = CountingStore(store)
        assert catalog.promoted_steps(counting, run) == sorted({10, 20, *steps})
        assert not [k for k in counting.got if "/promoted/history/" in k], counting.got
        counted.append(dict(counting.count))
        # the run-health page's read model, the same way
        view = RunView(CountingStore(store), run)
        assert view.promoted_steps == {10, 20, *steps}
        assert {c.step for c in view.checkpoints() if c.state == "promoted"} == {10, 20, *steps}
        assert not [k for k in view.store.got if "/promoted/history/" in k], view.store.got
    assert counted[0] == counted[1] and counted[0]["list"] == 1, counted


def test_a_lost_step_index_entry_is_backfilled(store: ObjectStore, run: str, save_checkpoints: Saver) -> None:
    _promote_all(store, run, save_checkpoints, [10])
    store.delete(schema.store_key(run, schema.promoted_step_path(10)))  # its writer died after the pointer
    assert catalog.promoted_steps(store, run) == [10]  # the pointer still names it
    _promote_all(store, run, save_checkpoints, [20])
    assert catalog.promoted_steps(store, run) == [10, 20]
    assert store.head(schema.store_key(run, schema.promoted_step_path(10))) is not None


def test_a_run_promoted_before_the_step_index_reads_its_history_until_its_next_promotion_indexes_it(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    """A pointer without `steps_indexed` (written before the index existed) is read through the history;
    the next promotion writes the index for every step of the history once and marks the pointer."""
    _promote_all(store, run, save_checkpoints, [10, 20, 30])
    for s in (10, 20, 30):  # as an older longrun left the run: no index, a pointer that does not mention it
        store.delete(schema.store_key(run, schema.promoted_step_path(s)))
    pointer = schema.store_key(run, schema.PROMOTED_POINTER_PATH)
    old = json.loads(store.get_bytes(pointer))
    del old["steps_indexed"]
    store.put_bytes(pointer, json.dumps(old).encode())
    counting = CountingStore(store)
    assert catalog.promoted_steps(counting, run) == [10, 20, 30]
    assert len([k for k in counting.got if "/promoted/history/" in k]) == 3  # one get per promotion
    _promote_all(store, run, save_checkpoints, [40])
    cur = catalog.current_pointer(store, run)
    assert cur is not None and cur[0].steps_indexed and cur[0].step == 40
    counting = CountingStore(store)
    assert catalog.promoted_steps(counting, run) == [10, 20, 30, 40]
    assert not [k for k in counting.got if "/promoted/history/" in k], counting.got
