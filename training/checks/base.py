"""The check protocol, the per-step context the trainer hands to checks, and the majority vote."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import nn


@dataclass(slots=True, kw_only=True)
class StepContext:
    """What a check may look at during one step. Built by the trainer, one per step."""

    step: int
    """The step being taken (counted from 1)."""
    rank: int
    """This process's global rank."""
    nodes: list[str]
    """Node name of every rank, in rank order."""
    device: torch.device
    """Where the model lives."""
    model: nn.Module
    """The model (weights are the pre-update weights until after_update)."""
    flat: torch.Tensor
    """Gradient buffer: [0:n) the gradient, then FLAG (local non-finite count) and LOSS slots. Before the
    all-reduce it holds this rank's local values; after it, the gradient part is the average and the
    slots hold sums over ranks."""
    n: int
    """Number of gradient elements in `flat`."""
    loss: torch.Tensor
    """This rank's own loss (a scalar)."""
    compute: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    """compute(r): (loss, flat local gradient) of rank r's micro-batch of this step, with this rank's
    current weights. Deterministic: equal inputs give equal bits on healthy hardware."""
    saving: bool = False
    """A checkpoint is saved after this step (the weight vote must run)."""
    grad_norm: torch.Tensor | None = None
    """Norm of the averaged gradient, set by the trainer after the all-reduce (it clips with it)."""
    scratch: dict[str, Any] = field(default_factory=dict)
    """Per-step state a check keeps between its phases."""

    FLAG: ClassVar[int] = 0
    LOSS: ClassVar[int] = 1
    SLOTS: ClassVar[int] = 2

    @property
    def world_size(self) -> int:
        return len(self.nodes)

    def slot(self, which: int) -> int:
        return self.n + which


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

    def before_reduce(self, ctx: StepContext) -> None: ...

    def after_reduce(self, ctx: StepContext) -> CheckResult | None: ...

    def after_update(self, ctx: StepContext) -> CheckResult | None: ...


class CheckBase:
    name = ""

    def due(self, step: int, *, saving: bool) -> bool:
        return True

    def before_reduce(self, ctx: StepContext) -> None:
        return None

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
