"""CPU snapshots: independent of the live state, buffers reused after release, spare memory capped."""

from __future__ import annotations

import torch

from training.checkpoint.snapshot import SnapshotPool, nbytes


def test_a_snapshot_shares_nothing_with_the_live_state() -> None:
    live = {"w": torch.ones(4), "groups": [{"lr": 0.1, "params": [0]}], "step": torch.tensor(3)}
    snap = SnapshotPool(max_spare_bytes=0).snapshot(live)
    live["w"].add_(1)
    live["groups"][0]["lr"] = 9.0
    live["step"].add_(1)
    assert torch.equal(snap["w"], torch.ones(4)) and snap["groups"][0]["lr"] == 0.1 and int(snap["step"]) == 3


def test_released_buffers_are_reused_by_the_next_snapshot() -> None:
    pool = SnapshotPool(max_spare_bytes=1 << 20)
    live = {"w": torch.arange(16.0)}
    first = pool.snapshot(live)
    ptr = first["w"].data_ptr()
    pool.release(first)
    assert pool.spare_bytes() == nbytes(first)
    live["w"].mul_(2)
    second = pool.snapshot(live)
    assert second["w"].data_ptr() == ptr and torch.equal(second["w"], torch.arange(16.0) * 2)
    assert pool.spare_bytes() == 0


def test_spare_memory_is_capped() -> None:
    pool = SnapshotPool(max_spare_bytes=64)
    snap = pool.snapshot({"a": torch.zeros(8), "b": torch.zeros(8), "c": torch.zeros(8)})  # 32 bytes each
    pool.release(snap)
    assert pool.spare_bytes() == 64
