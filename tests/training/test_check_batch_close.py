"""The last check batch of a rank reaches the store through a short outage at exit.

Chaos cell attribute x S3 (docs/reliability.md): SeaweedFS was SIGKILLed and restarted while the first job
was exiting after its SDC alert. Rank 0's last batch (steps 10-20, holding its passes at 10 and 15) was put
once at close, failed ("not in the store yet; kept for the next flush", but there was no next flush) and
lived only on the node. The pick then had no pass of rank 0 after step 5, bounded the restart at step 5
and resumed from step 0 instead of the promoted, valid step 10. The batch at close now keeps trying
(bounded), as an alert does; earlier batches already ride on the next flush."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from longrun.checkpoints import catalog
from longrun.checkpoints.pick import last_known_good

from training import events
from training.records import schema
from training.store.interface import ObjectInfo, StoreUnavailable
from training.store.local import LocalDirStore

RUN = "close-outage"
WORLD = 3


class FlakyChecks(LocalDirStore):
    """A local store whose next `fail` puts of check batches find it unreachable (a store restarting);
    `fail=None`: unreachable for good."""

    fail: int | None = 0

    def put_bytes(self, key: str, data: bytes, **kw: Any) -> ObjectInfo:
        if "/checks/" in key and (self.fail is None or self.fail > 0):
            if self.fail is not None:
                self.fail -= 1
            raise StoreUnavailable(f"put {key}: cannot reach the store (test outage)")
        return super().put_bytes(key, data, **kw)


def _writer(store: Any, tmp_path: Path, rank: int) -> events.EventWriter:
    return events.EventWriter(
        run=RUN,
        run_dir=tmp_path / f"run-r{rank}",
        store=store,
        rank=rank,
        flush_every=100,
        progress_interval_s=1.0,
    )


def _check(w: events.EventWriter, step: int, verdict: str = "pass") -> None:
    w.check(
        schema.record(
            "check",
            run=RUN,
            step=step,
            check="recompute",
            verdict=verdict,
            rank=w.rank,
            duration_s=0.1,
            world_size=WORLD,
        )  # fmt: skip
    )


def _drill(store: FlakyChecks, tmp_path: Path, outage_puts: int | None) -> events.EventWriter:
    """Ranks 1 and 2 flush steps 5-20 while the store is up; rank 0 flushes step 5 at a checkpoint, then
    its passes at 10 and 15 and the failure at 20 go out at close, into an outage of `outage_puts` puts."""
    for rank in (1, 2):
        w = _writer(store, tmp_path, rank)
        for s in (5, 10, 15):
            _check(w, s)
        _check(w, 20, "fail")
        w.close()
    r0 = _writer(store, tmp_path, 0)
    _check(r0, 5)
    r0.flush()  # the checkpoint-time batch (steps 1-9 in the drill), store up
    for s in (10, 15):
        _check(r0, s)
    _check(r0, 20, "fail")
    store.fail = outage_puts
    r0.close()
    return r0


def _bound(store: FlakyChecks) -> int | None:
    """The pick's last known-good step for the recompute check, from what the store holds."""
    lkg = last_known_good(("recompute",), 20, list(catalog.check_records(store, RUN)), world_size=WORLD)
    return lkg["recompute"][0]


def test_the_last_batch_rides_out_a_store_restart_at_exit(tmp_path: Path) -> None:
    store = FlakyChecks(tmp_path / "store")
    _drill(store, tmp_path, outage_puts=2)
    # Every rank's pass at 15 is in the store, so the pick may resume from a checkpoint up to step 15
    # (before the fix: 5, rank 0's batch at close was put once and lost).
    assert _bound(store) == 15
    assert store.fail == 0  # the outage happened: two puts were refused


def test_a_store_that_stays_away_costs_only_bounded_time_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(events, "CHECKS_CLOSE_DEADLINE_S", 1.0)
    store = FlakyChecks(tmp_path / "store")
    with caplog.at_level(logging.ERROR, logger="training.events"):
        r0 = _drill(store, tmp_path, outage_puts=None)
    # close returned; the records are on the node, not in the store, and the log says what that costs
    local = r0.run_dir / schema.check_batch_path(10, 20, 0)
    assert local.is_file() and "recompute" in local.read_text()
    assert any("NOT in the store" in r.getMessage() for r in caplog.records)
    # what the pick then sees: rank 0's last pass is at step 5 (the earlier checkpoint's batch)
    assert _bound(store) == 5
