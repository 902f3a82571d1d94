"""The check protocol, the per-step context the trainer hands to checks, and the majority vote."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn


class Peers(Protocol):
    """What the recompute check may ask of the guard at an audit step (training.api.peers.PeerBatches).
    `exchange` and `broadcast` are collectives: every rank calls them, in the same order."""

    def exchange(self, offset: int) -> Any:
        """Send this rank's micro-batch to rank (rank - offset) mod W; return the one of (rank + offset)."""
        ...

    def broadcast(self, src: int) -> Any:
        """Rank `src`'s micro-batch of this step, on every rank."""
        ...

    def recompute(self, batch: Any, rank: int) -> tuple[torch.Tensor, int]:
        """(loss, local gradient fingerprint) of `batch` as rank `rank` computed it this step, with this
        rank's pre-update weights, on the unwrapped module (no DDP hook fires, `p.grad` is untouched), under
        the RNG fork of (step, rank)."""
        ...

    def recompute_sharded(self, batch: Any, rank: int) -> tuple[torch.Tensor, int]:
        """(loss, local gradient fingerprint) of `batch` as rank `rank` computed it this step, forward and
        backward on the sharded module (FSDP2/HSDP) under the RNG fork of (step, rank), the fingerprint
        taken where FSDP reduce-scatters the local gradient; the real `p.grad` are put back afterwards. A
        collective (all-gathers, reduce-scatters): every rank calls it at the same time."""
        ...

    def recompute_loss(self, batch: Any, rank: int) -> torch.Tensor:
        """The loss of `batch` as rank `rank` computed it this step, forward only under `torch.no_grad()` on
        the sharded module (FSDP2/HSDP), under the RNG fork of (step, rank); `p.grad` is untouched. A
        collective under FSDP (the forward all-gathers shards): every rank calls it at the same time."""
        ...


@dataclass(slots=True, kw_only=True)
class StepContext:
    """What a check may look at during one step. Built by the guard (training.api.Guard), one per step."""

    step: int
    """The step being taken (counted from 1)."""
    rank: int
    """This process's global rank."""
    nodes: list[str]
    """Node name of every rank, in rank order."""
    device: torch.device
    """Where the model lives."""
    model: nn.Module
    """The unwrapped model (weights are the pre-update weights until after_update)."""
    loss: torch.Tensor
    """This rank's own loss (a scalar)."""
    local_nonfinite: torch.Tensor | None = None
    """A bool scalar: some local gradient of this rank was non-finite before the all-reduce (the DDP
    communication hook sets it; read only once the averaged gradient is non-finite)."""
    own_grad_fingerprint: int | None = None
    """At audit steps: the fingerprint of this rank's local, not yet averaged gradient, taken in the DDP
    communication hook (parameter order, one value per parameter, combined), or on a sharded model where
    FSDP reduce-scatters it (one value per FSDP unit, combined; None where the guard cannot see it)."""
    peers: Peers | None = None
    """At audit steps: the micro-batches of other ranks, and their recompute."""
    saving: bool = False
    """A checkpoint is saved after this step (the weight vote must run)."""
    grad_norm: torch.Tensor | None = None
    """Norm of the averaged gradient (the guard clips with it)."""
    scratch: dict[str, Any] = field(default_factory=dict)
    """Per-step state a check keeps between its phases."""

    @property
    def world_size(self) -> int:
        return len(self.nodes)


@dataclass(slots=True, kw_only=True)
class CheckResult:
    """The outcome of one check at one step."""

    check: str
    """schema.CHECKS name."""
    step: int
    """The step checked."""
    verdict: str
    """'pass' or 'fail'."""
    duration_s: float
    """Wall time this check spent in this step, collectives included."""
    suspect_ranks: list[int] = field(default_factory=list)
    """Ranks a strict majority names (empty when it cannot name one)."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """Fingerprints, losses, who disagreed with whom."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Not for the record: e.g. the weight fingerprints for the checkpoint manifest."""

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"


class Check(Protocol):
    """An in-loop SDC check. Phases it does not use are no-ops (see CheckBase)."""

    name: str

    def due(self, step: int, *, saving: bool) -> bool: ...

    def after_reduce(self, ctx: StepContext) -> CheckResult | None: ...

    def after_update(self, ctx: StepContext) -> CheckResult | None: ...


class CheckBase:
    name = ""

    def due(self, step: int, *, saving: bool) -> bool:
        return True

    def after_reduce(self, ctx: StepContext) -> CheckResult | None:
        return None

    def after_update(self, ctx: StepContext) -> CheckResult | None:
        return None

    # timing shared by the phases of one step
    def _clock(self, ctx: StepContext) -> float:
        return ctx.scratch.get(f"{self.name}.t", 0.0)

    def _add_time(self, ctx: StepContext, since: float) -> None:
        ctx.scratch[f"{self.name}.t"] = self._clock(ctx) + time.perf_counter() - since


def majority(values: Sequence[Hashable]) -> tuple[Hashable | None, list[int]]:
    """The value held by a strict majority of positions, and the positions that differ from it.
    (None, []) when no value has a strict majority."""
    if not values:
        return None, []
    value, count = Counter(values).most_common(1)[0]
    if 2 * count <= len(values):
        return None, []
    return value, [i for i, v in enumerate(values) if v != value]


def loss_bits(loss: torch.Tensor) -> int:
    """The exact bits of a loss as an int64 (the float64 that holds the float32 loss exactly)."""
    return int(loss.detach().to(torch.float64).cpu().reshape(1).view(torch.int64).item())


def bits_loss(bits: int) -> float:
    return float(torch.tensor([bits], dtype=torch.int64).view(torch.float64).item())
