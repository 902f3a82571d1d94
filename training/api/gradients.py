"""The DDP communication hook: where the guard sees this rank's local gradient before it is averaged.

Real `DistributedDataParallel` reduces gradients in buckets during the backward pass and never shows the
local values to the caller. A communication hook runs once per bucket, on the bucket's flat buffer of
local gradients, and returns the future of its reduction. Longrun's hook, per bucket, in this order:

1. drills on the local gradient (`nan`, `inf`, `scale`: training.faults), on bucket 0 only;
2. the finite check's local side: `isfinite(sum(buffer))`, or-ed into one flag that stays on the device
   (read only when the averaged gradient turns out non-finite: training.checks.finite);
3. at audit steps, one fingerprint per parameter of the local gradient, for the recompute check;
4. the all-reduce (sum, then divide by the world size). Bucket 0 carries one more element, this rank's
   loss, so the step's mean loss costs no collective of its own (float32/float64 gradients; other dtypes
   get one small all-reduce after the backward pass).

Cost, against DDP's built-in hook: one sum per bucket every step; at audit steps one pass over the
gradient for the fingerprints; bucket 0 (1 MiB by default) is copied twice to carry the loss. The bench
(`bench/bench_guard.py`) prints what it adds up to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from training.faults import Injector
from training.fingerprint.device import fingerprint_where_it_lives
from training.fingerprint.host import fingerprint_sequence

PACKABLE = (torch.float32, torch.float64)


class LocalGradients:
    """The hook's state for one model: set up per step by the guard (`begin`), read after backward."""

    def __init__(self, *, params: Sequence[torch.Tensor], world: int, injector: Injector | None) -> None:
        self.params = list(params)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.world = world
        self.injector = injector
        self.step = 0
        self.audit = False
        self.loss: torch.Tensor | None = None
        self.loss_sum: torch.Tensor | None = None
        self.nonfinite: torch.Tensor | None = None
        self._fps: dict[int, int] = {}

    def begin(self, step: int, *, audit: bool) -> None:
        self.step, self.audit = step, audit
        self.loss = self.loss_sum = self.nonfinite = None
        self._fps = {}

    def fingerprint(self) -> int:
        """The local gradient's fingerprint of this audit step, in parameter order."""
        missing = [i for i in range(len(self.params)) if i not in self._fps]
        if missing:
            raise RuntimeError(
                f"the communication hook saw no gradient for {len(missing)} parameter(s) (first index "
                f"{missing[0]}): every parameter that requires a gradient must be used by loss_fn"
            )
        return fingerprint_sequence([self._fps[i] for i in range(len(self.params))])

    def as_hook(self) -> Any:
        """The hook as DDP's `register_comm_hook` wants it: a function whose annotations are the real
        types (this module's annotations are strings, and DDP checks them)."""

        def hook(state: Any, bucket: Any) -> Any:
            return self(state, bucket)

        hook.__annotations__ = {
            "state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]
        }  # fmt: skip
        return hook

    def __call__(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buf = bucket.buffer()
        first = bucket.index() == 0
        if first and self.injector is not None:
            self.injector.local_gradients(self.step, buf)
        bad = ~torch.isfinite(buf.sum())
        self.nonfinite = bad if self.nonfinite is None else self.nonfinite | bad
        if self.audit:
            for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
                self._fps[self._index[id(p)]] = fingerprint_where_it_lives(g)
        world = self.world
        if first and self.loss is not None and buf.dtype in PACKABLE:
            packed = torch.cat([buf, self.loss.detach().reshape(1).to(buf.dtype)])
            fut = dist.all_reduce(packed, async_op=True).get_future()

            def unpack(f: torch.futures.Future[Any]) -> torch.Tensor:
                total = f.value()[0]
                self.loss_sum = total[-1:].clone()
                return buf.copy_(total[:-1]).div_(world)

            return fut.then(unpack)
        fut = dist.all_reduce(buf, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0].div_(world))
