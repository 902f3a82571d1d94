"""Micro-batches between ranks at an audit step, and their recompute: on the unwrapped module under DDP (loss
and local gradient), on the sharded module under FSDP2/HSDP with every rank at once (`recompute_sharded`:
loss and local gradient, seen where FSDP reduce-scatters it; `recompute_loss`: forward only, where it cannot
be seen).

A micro-batch is whatever the user's `loss_fn(model, batch)` takes: a tensor, or dicts, lists and tuples of
tensors and plain values (a Hugging Face `BatchEncoding` travels as a dict). It travels as the bytes of
`torch.save` and is read back with `torch.load(weights_only=True)`, so nothing a peer sends can run code.
On the common path each rank sends its batch to one checker and receives one target's (a shift by the
recompute offset, point to point on the default group: gloo or NCCL); only a disputed audit broadcasts a
batch to every rank.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from training.api.sharded_gradients import ReduceScatterTap
from training.fingerprint.device import fingerprint_where_it_lives
from training.fingerprint.host import fingerprint_sequence

LossFn = Callable[[nn.Module, Any], torch.Tensor]


def to_device(obj: Any, device: torch.device) -> Any:
    """`obj` with every tensor moved to `device`; mappings become dicts, tuples stay tuples."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(to_device(v, device) for v in obj)
    if isinstance(obj, list):
        return [to_device(v, device) for v in obj]
    return obj


def encode(batch: Any) -> torch.Tensor:
    """The batch as a uint8 tensor (torch.save of its CPU copy)."""
    buf = io.BytesIO()
    torch.save(to_device(batch, torch.device("cpu")), buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def decode(data: torch.Tensor, device: torch.device) -> Any:
    raw = io.BytesIO(data.cpu().numpy().tobytes())
    return to_device(torch.load(raw, map_location="cpu", weights_only=True), device)


def grad_fingerprint(grads: Sequence[torch.Tensor | None], params: Sequence[torch.Tensor]) -> int:
    """One 64-bit value over the per-parameter fingerprints of a gradient, in parameter order (a parameter
    without a gradient counts as zeros, as DDP's bucket holds it)."""
    return fingerprint_sequence(
        [
            fingerprint_where_it_lives(g if g is not None else torch.zeros_like(p))
            for g, p in zip(grads, params, strict=True)
        ]
    )


class PeerBatches:
    """One audit step's view of the other ranks' micro-batches (the `Peers` protocol of training.checks)."""

    def __init__(
        self,
        *,
        batch: Any,
        step: int,
        rank: int,
        world: int,
        module: nn.Module,
        params: Sequence[torch.Tensor],
        loss_fn: LossFn,
        forward: Callable[[int, int, Callable[[], torch.Tensor]], torch.Tensor],
        device: torch.device,
        wire: torch.device,
        grad_tap: ReduceScatterTap | None = None,
    ) -> None:
        self.batch, self.step, self.rank, self.world = batch, step, rank, world
        self.module, self.params, self.loss_fn = module, list(params), loss_fn
        self.forward = forward
        """forward(step, rank, fn): fn() under the RNG fork of (step, rank) (training.api.state.StepRng)."""
        self.device = device
        self.wire = wire
        """Where tensors travel: CPU for gloo, the rank's GPU for NCCL."""
        self.grad_tap = grad_tap
        """A sharded model's reduce-scatter, which sees the local gradient (`recompute_sharded`)."""
        self._encoded: torch.Tensor | None = None

    def _own(self) -> torch.Tensor:
        if self._encoded is None:
            self._encoded = encode(self.batch)
        return self._encoded

    def exchange(self, offset: int) -> Any:
        own = self._own().to(self.wire)
        to, frm = (self.rank - offset) % self.world, (self.rank + offset) % self.world
        size_out = torch.tensor([own.numel()], dtype=torch.int64, device=self.wire)
        size_in = torch.empty(1, dtype=torch.int64, device=self.wire)
        _sendrecv(size_out, to, size_in, frm)
        data = torch.empty(int(size_in.item()), dtype=torch.uint8, device=self.wire)
        _sendrecv(own, to, data, frm)
        return decode(data, self.device)

    def broadcast(self, src: int) -> Any:
        own = self._own().to(self.wire) if src == self.rank else None
        size = torch.tensor([own.numel() if own is not None else 0], dtype=torch.int64, device=self.wire)
        dist.broadcast(size, src=src)
        data = own if own is not None else torch.empty(int(size.item()), dtype=torch.uint8, device=self.wire)
        dist.broadcast(data, src=src)
        return self.batch if src == self.rank else decode(data, self.device)

    def recompute(self, batch: Any, rank: int) -> tuple[torch.Tensor, int]:
        with self._buffers_kept():
            loss = self.forward(self.step, rank, lambda: self.loss_fn(self.module, batch))
            grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return loss.detach(), grad_fingerprint(grads, self.params)

    def recompute_sharded(self, batch: Any, rank: int) -> tuple[torch.Tensor, int]:
        """(loss, local gradient fingerprint) on the sharded module, forward and backward, every rank at
        once (FSDP's all-gathers and reduce-scatters are collectives of each shard group, HSDP's all-reduce
        one across replicas). The fingerprint is the tap's (training.api.sharded_gradients), taken where
        FSDP reduce-scatters, as the owner's was in its real backward. The real gradients are put aside
        first and back afterwards (the references: nothing is copied), so the recompute's own reduced
        gradients, which FSDP writes to `p.grad`, are dropped and the optimizer steps with the real ones.
        Memory: one backward's activations and one more set of gradient shards, while it runs."""
        tap = self.grad_tap
        if tap is None:
            raise RuntimeError(
                "recompute_sharded without the reduce-scatter tap: see training.api.sharded_gradients"
            )
        real = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        try:
            with self._buffers_kept():
                tap.arm()
                loss = self.forward(self.step, rank, lambda: self.loss_fn(self.module, batch))
                loss.backward()
                fingerprint = tap.fingerprint()
        finally:
            tap.disarm()
            for p, g in zip(self.params, real, strict=True):
                p.grad = g
            reshard(self.module)
        return loss.detach(), fingerprint

    def recompute_loss(self, batch: Any, rank: int) -> torch.Tensor:
        """The loss alone, forward only under `torch.no_grad()` (a sharded model: no backward, so no
        reduce-scatter and `p.grad` untouched). Under FSDP the forward all-gathers each shard group's
        parameters: every rank of a group must call this at the same time. FSDP2 keeps the root's
        parameters gathered after a forward (its backward would need them); no backward follows here and
        the optimizer updates the shards next, so every FSDP module is resharded before returning (a
        gathered copy left in place would be the next step's stale weights)."""
        try:
            with self._buffers_kept(), torch.no_grad():
                loss = self.forward(self.step, rank, lambda: self.loss_fn(self.module, batch))
        finally:
            reshard(self.module)
        return loss.detach()

    @contextmanager
    def _buffers_kept(self) -> Iterator[None]:
        # A forward pass in training mode may update buffers (BatchNorm's running statistics): put them
        # back, so a recompute leaves the replica exactly as the real pass left it.
        kept = [(b, b.detach().clone()) for b in self.module.buffers()]
        try:
            yield
        finally:
            with torch.no_grad():
                for b, saved in kept:
                    b.copy_(saved)


def reshard(module: nn.Module) -> None:
    """Free the gathered parameters of every FSDP2 module in `module` (none: nothing to do)."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def _sendrecv(out: torch.Tensor, to: int, into: torch.Tensor, frm: int) -> None:
    ops = [dist.P2POp(dist.isend, out, to), dist.P2POp(dist.irecv, into, frm)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
