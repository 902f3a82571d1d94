"""The snapshot queue of the checkpoint saver: the only part of a save the training step waits for.

`put` admits a save when fewer than `max_pending` are in flight (bounded memory for snapshots), copies the
state into CPU buffers (`SnapshotPool`: on CUDA one fence per device for the whole save) and queues it
for the writer thread. The writer takes items with `get`, gives their buffers back with `recycle`, and
each save's end (ok or not) is counted with `finished`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from training.checkpoint.snapshot import SnapshotPool, nbytes


@dataclass(slots=True, kw_only=True)
class PendingSave:
    """One admitted save: its snapshot, waiting for the writer."""

    step: int
    model_state: Any
    optim_state: Any
    extra: Any
    manifest_fields: dict[str, Any]
    started: float
    """time.time() when save() was called."""


STOP = object()
"""Queued by `stop`: the writer thread ends when it takes it."""


class SnapshotQueue:
    """Admission, snapshot and hand-over of saves to the writer thread."""

    def __init__(self, *, max_pending: int, reuse_buffers: bool) -> None:
        self.max_pending = max_pending
        self.reuse_buffers = reuse_buffers
        self.pool = SnapshotPool(max_spare_bytes=0)  # grows to one snapshot's size with reuse_buffers
        self._cond = threading.Condition()
        self._pending = 0
        self._items: queue.Queue[Any] = queue.Queue()

    def put(
        self,
        *,
        step: int,
        model_state: Mapping[str, Any],
        optim_state: Mapping[str, Any],
        extra: Mapping[str, Any],
        manifest_fields: dict[str, Any],
        timeout_s: float,
    ) -> bool:
        """Snapshot and queue a save; False (nothing queued) when no slot freed up within `timeout_s`."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._pending < self.max_pending, timeout=timeout_s):
                return False
            self._pending += 1
        # One snapshot call: on CUDA its non-blocking copies share one fence.
        snap_model, snap_optim, snap_extra = self.pool.snapshot(
            (dict(model_state), dict(optim_state), dict(extra))
        )
        self._items.put(
            PendingSave(
                step=step,
                model_state=snap_model,
                optim_state=snap_optim,
                extra=snap_extra,
                manifest_fields=manifest_fields,
                started=time.time(),
            )
        )
        return True

    def get(self, timeout_s: float) -> PendingSave | object | None:
        """The next save, `STOP`, or None when nothing came within `timeout_s`."""
        try:
            return self._items.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def stop(self) -> None:
        self._items.put(STOP)

    def recycle(self, item: PendingSave) -> None:
        """The writer is done with the snapshot: keep its buffers for the next save (or drop them)."""
        parts = (item.model_state, item.optim_state, item.extra)
        if self.reuse_buffers:
            self.pool.max_spare_bytes = max(self.pool.max_spare_bytes, sum(nbytes(x) for x in parts))
            for x in parts:
                self.pool.release(x)
        item.model_state = item.optim_state = item.extra = None

    def finished(self) -> None:
        """One admitted save ended (ok or not): its slot is free."""
        with self._cond:
            self._pending -= 1
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return self._pending

    def wait_empty(self, timeout_s: float) -> bool:
        """Block until no save is in flight; False if `timeout_s` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def abandon(self) -> int:
        """Forget the saves still in flight (the writer stopped); returns how many there were."""
        with self._cond:
            left, self._pending = self._pending, 0
            self._cond.notify_all()
        return left
