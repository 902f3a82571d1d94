"""The staged snapshot path (pinned buffers reused across saves, non-blocking copies, one fence per
snapshot), which CUDA tensors take. No GPU here: the path is routed for CPU tensors with unpinned buffers,
so its bookkeeping runs; the CUDA copies and the event fence run in bench/gpu/run.sh on a device."""

from __future__ import annotations

import pytest
import torch

from training.checkpoint import snapshot as snapshot_mod
from training.checkpoint.snapshot import SnapshotPool, fence


def staged_pool(max_spare_bytes: int = 1 << 20) -> SnapshotPool:
    return SnapshotPool(max_spare_bytes=max_spare_bytes, staged=("cpu",), pin_memory=False)


def test_defaults_stage_only_cuda_and_pin_only_with_cuda() -> None:
    pool = SnapshotPool(max_spare_bytes=0)
    assert pool.staged == ("cuda",)
    assert pool.pin_memory is torch.cuda.is_available()


def test_staged_copies_are_independent_contiguous_and_equal() -> None:
    live = {"w": torch.randn(4, 6), "t": torch.randn(6, 4).T, "step": 3, "nested": [torch.arange(5)]}
    snap = staged_pool().snapshot(live)
    for got, want in [(snap["w"], live["w"]), (snap["t"], live["t"]), (snap["nested"][0], live["nested"][0])]:
        assert torch.equal(got, want) and got.is_contiguous()
        assert got.untyped_storage().data_ptr() != want.untyped_storage().data_ptr()
    live["w"].add_(1)
    assert not torch.equal(snap["w"], live["w"])
    assert snap["step"] == 3


def test_staged_buffers_are_reused_across_saves() -> None:
    pool = staged_pool()
    live = {"w": torch.randn(64, 64), "b": torch.randn(64)}
    first = pool.snapshot(live)
    ptrs = {k: v.data_ptr() for k, v in first.items()}
    pool.release(first)
    del first
    live["w"].mul_(2)
    second = pool.snapshot(live)
    assert {k: v.data_ptr() for k, v in second.items()} == ptrs
    assert torch.equal(second["w"], live["w"])
    assert pool.spare_bytes() == 0


def test_one_fence_per_snapshot_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[set[torch.device]] = []
    monkeypatch.setattr(snapshot_mod, "fence", lambda devices: calls.append(set(devices)))
    model, optim, extra = staged_pool().snapshot(({"w": torch.ones(3)}, {"m": torch.ones(2)}, {"step": 1}))
    assert calls == [{torch.device("cpu")}]
    assert torch.equal(optim["m"], torch.ones(2)) and extra == {"step": 1}


def test_fence_without_cuda_devices_waits_for_nothing() -> None:
    """fence() touches CUDA only for CUDA devices: for CPU tensors, or none, it returns at once and leaves
    CUDA uninitialised. On this CPU build any CUDA event or stream call raises, so a fence that waited on a
    CPU device fails here (checked by dropping its device-type test)."""
    assert fence({torch.device("cpu")}) is None
    assert fence(set()) is None
    assert not torch.cuda.is_initialized()


def test_cpu_path_is_unchanged_by_default() -> None:
    pool = SnapshotPool(max_spare_bytes=1 << 20)
    live = {"w": torch.randn(8, 8)}
    snap = pool.snapshot(live)
    assert not snap["w"].is_pinned()
    pool.release(snap)
    assert pool.spare_bytes() == 8 * 8 * 4
    again = pool.snapshot(live)
    assert torch.equal(again["w"], live["w"]) and pool.spare_bytes() == 0
