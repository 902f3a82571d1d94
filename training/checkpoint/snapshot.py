"""CPU snapshots of training state: the only part of a checkpoint save the training step waits for.

A snapshot copies every tensor into CPU memory that nothing else references, so training may change the
live tensors the moment `save()` returns. Buffers of a finished save are reused by the next one (same
dtype and shape): writing into memory that is already mapped avoids the page faults of a fresh
allocation.

Device tensors (CUDA) take the staged path: each is copied with `non_blocking=True` on the current stream
into a pinned host buffer (reused across saves like the CPU ones, so the host never pins memory twice),
and one event per device, recorded after the last copy and waited on once, is the only wait before the
snapshot goes to the writer. The stream orders the copies after the kernels that produced the weights.
Which device types are staged is a parameter, so the path's bookkeeping runs in CPU tests too (with
`pin_memory=False`); the CUDA copies themselves run only on a GPU (bench/gpu/run.sh).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

import torch

_Key = tuple[torch.dtype, tuple[int, ...], bool]  # (dtype, shape, pinned)


class SnapshotPool:
    """Takes snapshots, and takes back their buffers once a save is done with them."""

    def __init__(
        self, *, max_spare_bytes: int, staged: tuple[str, ...] = ("cuda",), pin_memory: bool | None = None
    ) -> None:
        self.max_spare_bytes = max_spare_bytes
        """Cap on memory kept for reuse between saves (pinned buffers included)."""
        self.staged = staged
        """Device types copied through pinned buffers with non-blocking copies and one fence."""
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        """Page-lock the staging buffers (needs CUDA; False only in CPU tests of the staged path)."""
        self._spare: dict[_Key, list[torch.Tensor]] = {}
        self._spare_bytes = 0
        self._lock = threading.Lock()

    def snapshot(self, obj: Any) -> Any:
        """A deep copy of `obj` whose tensors are CPU tensors owned by the snapshot. Pass everything one
        save needs in one call (a tuple or dict): the staged copies then share one fence."""
        devices: set[torch.device] = set()
        out = self._copy(obj, devices)
        fence(devices)  # the non_blocking copies must land before the writer reads the buffers
        return out

    def _take(self, t: torch.Tensor, pinned: bool = False) -> torch.Tensor | None:
        key = (t.dtype, tuple(t.shape), pinned)
        with self._lock:
            bufs = self._spare.get(key)
            if not bufs:
                return None
            buf = bufs.pop()
            self._spare_bytes -= buf.numel() * buf.element_size()
            return buf

    def _staged_copy(self, t: torch.Tensor, devices: set[torch.device]) -> torch.Tensor:
        buf = self._take(t, pinned=self.pin_memory)
        if buf is None:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pin_memory)
        buf.copy_(t, non_blocking=True)
        devices.add(t.device)
        return buf

    def _copy(self, obj: Any, devices: set[torch.device]) -> Any:
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            if t.device.type in self.staged and t.layout is torch.strided:
                return self._staged_copy(t, devices)
            if t.device.type != "cpu":
                return t.to("cpu")
            if t.layout is torch.strided:
                buf = self._take(t)
                if buf is not None:
                    return buf.copy_(t)
            return t.to("cpu", copy=True)
        if isinstance(obj, Mapping):
            return {k: self._copy(v, devices) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._copy(v, devices) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self._copy(v, devices) for v in obj)
        if isinstance(obj, int | float | str | bool | type(None)):
            return obj
        return copy.deepcopy(obj)

    def release(self, snap: Any) -> None:
        """Give a snapshot's tensors back for reuse; the caller must hold no other reference to them."""
        for t in _tensors(snap):
            if t.device.type != "cpu" or t.layout is not torch.strided:
                continue
            size = t.numel() * t.element_size()
            with self._lock:
                if self._spare_bytes + size > self.max_spare_bytes:
                    return
                self._spare.setdefault((t.dtype, tuple(t.shape), t.is_pinned()), []).append(t)
                self._spare_bytes += size

    def spare_bytes(self) -> int:
        with self._lock:
            return self._spare_bytes


def fence(devices: set[torch.device]) -> None:
    """Wait once per CUDA device for the copies queued on its current stream (an event, not a device-wide
    synchronize: other streams' work, e.g. the next step's compute on a side stream, is not waited for)."""
    for dev in devices:
        if dev.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(dev))
            event.synchronize()


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


def nbytes(obj: Any) -> int:
    """Bytes of the tensors in `obj`."""
    return sum(t.numel() * t.element_size() for t in _tensors(obj))
