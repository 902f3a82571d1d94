"""The in-loop SDC checks: one protocol, three small classes, composed from a CheckConfig.

A guarded step (training.api.Guard) has two moments where a check may act:

    after_reduce(ctx)   after the backward pass and DDP's all-reduce, before the optimizer step: a failure
                        here skips the update. What the check needs of the local, not yet averaged gradient
                        was taken in DDP's communication hook (ctx.local_nonfinite, ctx.own_grad_fingerprint)
    after_update(ctx)   after the optimizer step (the weight vote)

Collectives inside a check run on every rank or on none: `due()` is a pure function of the step, and a
verdict is computed from gathered data, so every rank takes the same branch.
"""

from __future__ import annotations

from training.checks.base import Check, CheckResult, Peers, StepContext, majority
from training.checks.finite import FiniteCheck
from training.checks.recompute import RecomputeCheck
from training.checks.weight_vote import WeightVoteCheck
from training.config import CheckConfig

__all__ = [
    "Check",
    "CheckResult",
    "Peers",
    "StepContext",
    "FiniteCheck",
    "RecomputeCheck",
    "WeightVoteCheck",
    "build_checks",
    "majority",
]


def build_checks(cfg: CheckConfig) -> list[Check]:
    """The enabled checks, in the order they must run (finite before recompute: a NaN is named by the
    cheaper, more specific check)."""
    checks: list[Check] = []
    if cfg.enabled("finite"):
        checks.append(FiniteCheck())
    if cfg.enabled("recompute") and cfg.recompute_every:
        checks.append(RecomputeCheck(every=cfg.recompute_every, loss_rtol=cfg.recompute_loss_rtol))
    if cfg.enabled("weight_vote"):
        checks.append(WeightVoteCheck(every=cfg.vote_every))
    return checks
