"""Check 1: every local gradient is finite before the all-reduce; the averaged gradient before the step.

Cost on a clean step: one sum per DDP bucket in the communication hook (`isfinite(sum(g))`: a NaN or Inf
anywhere makes the sum non-finite; `isfinite(g).all()` would double a CPU step), kept as a flag on the
device, and the norm of the averaged gradient, which the guard computes for clipping anyway. No collective
of its own: a non-finite local gradient makes the average non-finite too (NaN and Inf survive a sum), so
only when the averaged norm is non-finite are the local flags gathered, to name the ranks.
"""

from __future__ import annotations

import math
import time

import torch

from training.checks.base import CheckBase, CheckResult, StepContext
from training.checks.replicas import ReplicaLayout
from training.dist import all_gather_int64


class FiniteCheck(CheckBase):
    name = "finite"

    def after_reduce(self, ctx: StepContext) -> CheckResult | None:
        t0 = time.perf_counter()
        norm = float(ctx.grad_norm.item()) if ctx.grad_norm is not None else 0.0
        if math.isfinite(norm):
            self._add_time(ctx, t0)
            return CheckResult(check=self.name, step=ctx.step, verdict="pass", duration_s=self._clock(ctx))
        local = ctx.local_nonfinite if ctx.local_nonfinite is not None else torch.tensor(False)
        mine = int(bool(local.item()))
        flags = all_gather_int64([mine], ctx.device)[:, 0].tolist()
        suspects = [r for r, f in enumerate(flags) if f]
        self._add_time(ctx, t0)
        if suspects:
            return CheckResult(
                check=self.name,
                step=ctx.step,
                verdict="fail",
                duration_s=self._clock(ctx),
                suspect_ranks=suspects,
                evidence={
                    "where": "local gradient before the all-reduce",
                    "nonfinite_ranks": suspects,
                    "nonfinite_nodes": [ctx.nodes[r] for r in suspects],
                    "flags_by_rank": flags,
                },
            )
        # Every local gradient was finite, the average is not: the fault is in the reduction (or an overflow
        # of the sum). No rank can be named from here.
        return CheckResult(
            check=self.name,
            step=ctx.step,
            verdict="fail",
            duration_s=self._clock(ctx),
            evidence={"where": "averaged gradient after the all-reduce", "grad_norm": str(norm)},
        )


class ShardedFiniteCheck(CheckBase):
    """The finite check of a sharded model (FSDP2, HSDP): FSDP has no communication hook that shows the
    local gradient before its reduce-scatter, so the honest place is after backward, on what each rank
    holds: its shard of the reduced gradient. `ctx.local_nonfinite` is this rank's flag (some element of its
    gradient shards is NaN or Inf); the flags are all-gathered every step (one int64 per rank), so every rank
    reaches the same verdict from the same data.

    Who is named, by `layout` (training.checks.replicas.ReplicaLayout): the reduction delivers the same shard
    to every rank that holds it, so a rank whose shard is non-finite while another holder of the same shard
    is finite went wrong after the reduction, on its own: it is named. When every holder of a shard is
    non-finite the value came through the reduce-scatter (from some rank's local gradient, or the reduction
    itself), and which rank fed it in is no longer visible: the check fails without naming anyone."""

    name = "finite"

    def __init__(self, *, layout: ReplicaLayout) -> None:
        self.layout = layout

    def after_reduce(self, ctx: StepContext) -> CheckResult | None:
        t0 = time.perf_counter()
        local = ctx.local_nonfinite if ctx.local_nonfinite is not None else torch.tensor(False)
        flags = all_gather_int64([int(bool(local.item()))], ctx.device)[:, 0].tolist()
        self._add_time(ctx, t0)
        if not any(flags):
            return CheckResult(check=self.name, step=ctx.step, verdict="pass", duration_s=self._clock(ctx))
        bad_shards = sorted({self.layout.shard_of[r] for r, f in enumerate(flags) if f})
        suspects = [
            r
            for s in bad_shards
            for r in self.layout.holders(s)
            if flags[r] and not all(flags[h] for h in self.layout.holders(s))
        ]
        whole = [s for s in bad_shards if all(flags[h] for h in self.layout.holders(s))]
        return CheckResult(
            check=self.name,
            step=ctx.step,
            verdict="fail",
            duration_s=self._clock(ctx),
            suspect_ranks=sorted(suspects),
            evidence={
                "where": "gradient shard after the reduce-scatter",
                "nonfinite_ranks": [r for r, f in enumerate(flags) if f],
                "nonfinite_nodes": [ctx.nodes[r] for r, f in enumerate(flags) if f],
                "flags_by_rank": flags,
                "layout": self.layout.describe(),
                "why_unnamed": (
                    None
                    if not whole
                    else f"every holder of shard(s) {whole} is non-finite: it came through the reduction"
                ),
            },
        )
