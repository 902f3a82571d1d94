"""CPU snapshots of training state: the only part of a checkpoint save the training step waits for.

A snapshot copies every tensor into CPU memory that nothing else references, so training may change the
live tensors the moment `save()` returns. Buffers of a finished save are reused by the next one (same
dtype and shape): writing into memory that is already mapped avoids the page faults of a fresh
allocation. CUDA tensors are copied with `non_blocking=True` (into pinned host memory) and synchronized
once at the end, as NVRx's own `preload_tensors` does; that path is not exercised on this CPU-only host.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

import torch

_Key = tuple[torch.dtype, tuple[int, ...]]


class SnapshotPool:
    """Takes snapshots, and takes back their buffers once a save is done with them."""

    def __init__(self, *, max_spare_bytes: int) -> None:
        self.max_spare_bytes = max_spare_bytes
        """Cap on memory kept for reuse between saves."""
        self._spare: dict[_Key, list[torch.Tensor]] = {}
        self._spare_bytes = 0
        self._lock = threading.Lock()

    def snapshot(self, obj: Any) -> Any:
        """A deep copy of `obj` whose tensors are CPU tensors owned by the snapshot."""
        cuda: list[bool] = []
        out = self._copy(obj, cuda)
        if cuda:
            torch.cuda.synchronize()  # the non_blocking D2H copies must land before the writer reads them
        return out

    def _take(self, t: torch.Tensor) -> torch.Tensor | None:
        key = (t.dtype, tuple(t.shape))
        with self._lock:
            bufs = self._spare.get(key)
            if not bufs:
                return None
            buf = bufs.pop()
            self._spare_bytes -= buf.numel() * buf.element_size()
            return buf

    def _copy(self, obj: Any, cuda: list[bool]) -> Any:
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            if t.device.type != "cpu":
                cuda.append(True)
                return t.to("cpu", non_blocking=True)
            if t.layout is torch.strided:
                buf = self._take(t)
                if buf is not None:
                    return buf.copy_(t)
            return t.to("cpu", copy=True)
        if isinstance(obj, Mapping):
            return {k: self._copy(v, cuda) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._copy(v, cuda) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self._copy(v, cuda) for v in obj)
        if isinstance(obj, int | float | str | bool | type(None)):
            return obj
        return copy.deepcopy(obj)

    def release(self, snap: Any) -> None:
        """Give a snapshot's tensors back for reuse; the caller must hold no other reference to them."""
        for t in _tensors(snap):
            if t.device.type != "cpu" or t.layout is not torch.strided or t.is_pinned():
                continue  # pinned buffers came from CUDA copies; let the caching host allocator keep them
            size = t.numel() * t.element_size()
            with self._lock:
                if self._spare_bytes + size > self.max_spare_bytes:
                    return
                self._spare.setdefault((t.dtype, tuple(t.shape)), []).append(t)
                self._spare_bytes += size

    def spare_bytes(self) -> int:
        with self._lock:
            return self._spare_bytes


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
