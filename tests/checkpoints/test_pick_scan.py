"""The pick reads only the check batches near its alert (issue 31 item 3): the same last known good steps
as reading every batch, and a cost that does not grow with the age of the run.

The property is checked on generated runs (ranks, batch sizes, missing and failed records, worlds that
disagree, batches that break the key rules), against `last_known_good` over every record of the run. The
cost is counted by a store wrapper at two ages of one run."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from helpers.check_batches import put_check_batches
from helpers.counting_store import CountingStore
from longrun.checkpoints import catalog
from longrun.checkpoints.pick import last_known_good, scan_last_known_good

from training.records import schema
from training.store.interface import ObjectStore
from training.store.local import LocalDirStore

CHECKS = ("finite", "recompute", "weight_vote")
RUN = "scan"


def _rec(check: str, step: int, rank: int, verdict: str = "pass", world: int | None = 3) -> dict[str, Any]:
    extra = {} if world is None else {"world_size": world}
    return schema.record(
        "check", run=RUN, step=step, check=check, verdict=verdict, rank=rank, duration_s=0.001, **extra
    )


def _random_run(rng: random.Random, store: ObjectStore) -> int:
    """A run's check batches with the holes and faults a pick must see; returns its last step."""
    ranks, steps = rng.randint(1, 3), rng.randint(1, 320)
    cadence = rng.choice([1, 5, 10, 37])
    recs = []
    for step in range(1, steps + 1):
        for rank in range(ranks):
            for check in CHECKS:
                if check != "finite" and step % cadence:
                    continue
                roll = rng.random()
                if roll < 0.03:
                    continue  # a missing record: no pass at that step
                verdict = "fail" if roll < 0.05 else "pass"
                world = ranks if roll < 0.97 else rng.choice([None, ranks + 1])
                recs.append(_rec(check, step, rank, verdict, world))
    put_check_batches(store, RUN, recs, every=rng.choice([1, 7, 20, schema.CHECK_BATCH_MAX_SPAN]))
    # Batches that break the key rules are no evidence to any reader: one too long, one whose records
    # lie outside its key's steps, one holding another rank's records.
    bad_step = rng.randint(1, steps)
    for first, last, rank, rec in (
        (1, schema.CHECK_BATCH_MAX_SPAN + 1, 0, _rec("recompute", bad_step, 0, "fail")),
        (bad_step, bad_step, 0, _rec("finite", max(1, bad_step - 1), 0, "fail")),
        (bad_step, bad_step, 1, _rec("finite", bad_step, 0, "fail")),
    ):
        if rng.random() < 0.5:
            key = schema.store_key(RUN, schema.check_batch_path(first, last, rank))
            if store.head(key) is None:
                store.put_bytes(key, (json.dumps(rec) + "\n").encode())
    return steps


@pytest.mark.parametrize("seed", range(30))
def test_the_scan_finds_what_reading_every_batch_finds(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    store = LocalDirStore(tmp_path / "store")
    steps = _random_run(rng, store)
    everything = list(catalog.check_records(store, RUN))
    for _ in range(8):
        alert = rng.randint(0, steps + 3)
        checks = rng.choice([CHECKS, ("recompute", "weight_vote"), ("finite",)])
        world = rng.choice([None, 3])
        full = last_known_good(checks, alert, everything, world_size=world)
        assert (
            scan_last_known_good(store, RUN, checks, alert, world_size=world, floor=0).last_known_good == full
        )
        # With a floor, a check it leaves undecided has nothing good at or past the floor.
        floor = rng.randint(0, max(alert, 0))
        scanned = scan_last_known_good(
            store, RUN, checks, alert, world_size=world, floor=floor
        ).last_known_good
        for c in checks:
            got, want = scanned[c][0], full[c][0]
            assert got == want or (got is None and (want is None or want < floor)), (
                c,
                alert,
                floor,
                got,
                want,
            )


def _clean_history(first: int, last: int, ranks: int = 4) -> list[dict[str, Any]]:
    return [
        _rec(check, step, rank, world=ranks)
        for step in range(first, last + 1)
        for rank in range(ranks)
        for check in CHECKS
        if check == "finite" or step % 10 == 0
    ]


def test_what_the_scan_reads_does_not_grow_with_the_age_of_the_run(tmp_path: Path) -> None:
    """The same alert 15 steps after the newest vote, on a run 300 steps old and on the same run 3,000
    steps old: the same requests. Reading every batch costs ten times as many gets at the older age."""
    store = LocalDirStore(tmp_path / "store")
    counts = {}
    for age in (300, 3000):
        put_check_batches(store, RUN, _clean_history(age - 299 if age == 300 else 301, age))
        counting = CountingStore(store)
        scan = scan_last_known_good(counting, RUN, CHECKS, age + 5, world_size=4, floor=0)  # type: ignore[arg-type]
        assert {c: s for c, (s, _why) in scan.last_known_good.items()} == {
            "finite": age,
            "recompute": age,
            "weight_vote": age,
        }
        counts[age] = dict(counting.count)
        assert scan.batches_read == counting.count["get"]
    assert counts[300] == counts[3000], counts
    assert counts[3000]["get"] == 4, counts  # the newest batch of each rank
    every = CountingStore(store)
    assert len(list(catalog.check_records(every, RUN))) == len(_clean_history(1, 3000))  # type: ignore[arg-type]
    assert every.count["get"] == 4 * 3000 // 20


def test_a_long_gap_with_no_pass_stops_at_the_floor(tmp_path: Path) -> None:
    """No vote passed on every rank for 2,000 steps before the alert (rank 3 never voted): the scan stops at
    the oldest step the pick could choose, not at step 1."""
    store = LocalDirStore(tmp_path / "store")
    recs = [
        r
        for r in _clean_history(1, 2500)
        if not (r["check"] == "weight_vote" and r["rank"] == 3 and r["step"] > 500)
    ]
    put_check_batches(store, RUN, recs)
    counting = CountingStore(store)
    scan = scan_last_known_good(counting, RUN, CHECKS, 2505, world_size=4, floor=2300)  # type: ignore[arg-type]
    assert scan.last_known_good["weight_vote"][0] is None
    assert "from step" in scan.last_known_good["weight_vote"][1]
    assert scan.last_known_good["recompute"][0] == 2500
    assert counting.count["get"] <= 4 * (2505 - 2300 + 2 * schema.CHECK_BATCH_MAX_SPAN) // 20, counting.count
    full = scan_last_known_good(store, RUN, CHECKS, 2505, world_size=4, floor=0).last_known_good
    assert full["weight_vote"][0] == 500
