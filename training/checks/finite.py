"""Check 1: every local gradient is finite before the all-reduce; the averaged gradient before the step.

Cost: one reduction per side. Locally, `isfinite(sum(g))` (a NaN or Inf anywhere makes the sum
non-finite; `isfinite(g).all()` would double a CPU step). The flag rides in a spare slot of the gradient
buffer, so the all-reduce itself counts the bad ranks: no extra collective on a clean step. Only when the
count is non-zero are the flags gathered, to name the ranks. The averaged side reuses the gradient norm
the trainer computes for clipping.
"""

from __future__ import annotations

import math
import time

import torch

from training.checks.base import CheckBase, CheckResult, StepContext
from training.dist import all_gather_int64


class FiniteCheck(CheckBase):
    name = "finite"

    def before_reduce(self, ctx: StepContext) -> None:
        t0 = time.perf_counter()
        bad = ~torch.isfinite(ctx.flat[: ctx.n].sum())
        ctx.flat[ctx.slot(ctx.FLAG)] = bad.to(ctx.flat.dtype)
        ctx.scratch["finite.local_bad"] = bad
        self._add_time(ctx, t0)

    def after_reduce(self, ctx: StepContext) -> CheckResult | None:
        t0 = time.perf_counter()
        count = float(ctx.flat[ctx.slot(ctx.FLAG)].item())
        if count > 0:
            mine = int(bool(ctx.scratch["finite.local_bad"].item()))
            flags = all_gather_int64([mine], ctx.device)[:, 0].tolist()
            suspects = [r for r, f in enumerate(flags) if f]
            self._add_time(ctx, t0)
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
        norm = float(ctx.grad_norm.item()) if ctx.grad_norm is not None else 0.0
        self._add_time(ctx, t0)
        if not math.isfinite(norm):
            # Every local gradient was finite, the average is not: the fault is in the reduction (or an
            # overflow of the sum). No rank can be named from here.
            return CheckResult(
                check=self.name,
                step=ctx.step,
                verdict="fail",
                duration_s=self._clock(ctx),
                evidence={"where": "averaged gradient after the all-reduce", "grad_norm": str(norm)},
            )
        return CheckResult(check=self.name, step=ctx.step, verdict="pass", duration_s=self._clock(ctx))
