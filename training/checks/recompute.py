"""Check 2: cross-node recompute at audit steps.

Rank r also computes the micro-batch of rank (r + k) mod W with its own (identical, pre-update) weights,
where k is the smallest offset that puts every rank's target on another node. The guard sends each
micro-batch to its checker (a shift by k, point to point), so user data need not be deterministic or
addressable by index. The recompute runs on the unwrapped module under the target's RNG fork. It compares
the loss bits and a fingerprint (xxh3 on CPU, dfp64 on CUDA) of the local, not yet averaged gradient with
what the target reported, which the target took in DDP's communication hook (one all-gather of 4 int64
per rank).

One checker per target cannot say which of the two is wrong. So on a mismatch (rare) every rank
recomputes each disputed micro-batch, and the opinions are put to a vote: ranks whose value differs from a
strict majority are the suspects (each disputed micro-batch is broadcast from its owner for that). With fewer than three nodes a majority of ranks can still be one node's
doing, so the check reports the mismatch without naming anyone.

Sharded models (FSDP2, HSDP: `sharded`). One rank cannot recompute alone: the forward all-gathers the
shards of its group, a collective the group's other ranks must make too. So every rank recomputes at once,
in one round: rank r the micro-batch of rank (r + k) mod W, forward and backward on the sharded module, and
the collectives of every shard group line up (under HSDP on `Guard.device_mesh`, one row per node, k is the
ranks per node: rank (row i, column c) recomputes rank (row i + 1, column c)). Every rank all-gathers the
same full weights (HSDP's replicas hold equal shards; FSDP2's one copy is gathered by all), so the loss and
the local gradient a rank recomputes must equal, bit for bit, what the owner computed. The local gradient is
seen where FSDP reduce-scatters it (training.api.sharded_gradients: the input of the collective, before any
reduction), on the owner in its real backward and on the checker in the recompute's, whose gradients the
guard then puts aside. Where that tap cannot be installed (`gradients=False`) the recompute is forward only
and compares the loss alone. A dispute round is also every rank at once: each disputed micro-batch is
recomputed by every rank, its owner included (its value discarded: its own report is its opinion), so no
shard group waits on a rank that skipped the pass.
"""

from __future__ import annotations

import math
import time
from typing import Any

from training.checks.base import CheckBase, CheckResult, Peers, StepContext, bits_loss, loss_bits, majority
from training.dist import all_gather_int64
from training.fingerprint.host import from_int64, hex64, to_int64


def derangement_offset(nodes: list[str]) -> tuple[int, bool]:
    """Smallest k >= 1 such that every rank r and rank (r + k) mod W sit on different nodes; and whether
    one exists (False: one node only, k = 1, same-node checking)."""
    w = len(nodes)
    for k in range(1, w):
        if all(nodes[r] != nodes[(r + k) % w] for r in range(w)):
            return k, True
    return 1, False


Opinion = tuple[int, ...]
"""What a rank says one micro-batch gave: (loss bits, gradient fingerprint), or (loss bits,) loss only."""


class RecomputeCheck(CheckBase):
    name = "recompute"

    def __init__(
        self, *, every: int, loss_rtol: float = 0.0, sharded: bool = False, gradients: bool = True
    ) -> None:
        self.every, self.loss_rtol = every, loss_rtol
        self.sharded = sharded
        """Every rank recomputes at once, on the sharded module (FSDP2/HSDP)."""
        self.gradients = gradients
        """The local gradient's fingerprint is compared beside the loss."""

    def for_sharded(self, *, gradients: bool) -> RecomputeCheck:
        """This check for a sharded model: the same cadence and tolerance, every rank at once; with the
        local gradient where the guard sees it (training.api.sharded_gradients), else the loss only."""
        return RecomputeCheck(every=self.every, loss_rtol=self.loss_rtol, sharded=True, gradients=gradients)

    def due(self, step: int, *, saving: bool) -> bool:
        return self.every > 0 and step % self.every == 0

    def _agree(self, a: Opinion, b: Opinion) -> bool:
        if self.loss_rtol == 0:
            return a == b
        la, lb = bits_loss(a[0]), bits_loss(b[0])
        return math.isclose(la, lb, rel_tol=self.loss_rtol, abs_tol=0.0)

    def _recompute(self, peers: Peers, batch: Any, rank: int) -> Opinion:
        if not self.gradients:
            return (loss_bits(peers.recompute_loss(batch, rank)),)
        loss, fp = peers.recompute_sharded(batch, rank) if self.sharded else peers.recompute(batch, rank)
        return loss_bits(loss), fp

    def _own(self, ctx: StepContext) -> Opinion:
        if not self.gradients:
            return (loss_bits(ctx.loss),)
        assert ctx.own_grad_fingerprint is not None
        return loss_bits(ctx.loss), ctx.own_grad_fingerprint

    def after_reduce(self, ctx: StepContext) -> CheckResult | None:
        w = ctx.world_size
        if w < 2:
            return None
        t0 = time.perf_counter()
        if ctx.peers is None or (ctx.own_grad_fingerprint is None and self.gradients):
            raise RuntimeError(
                "recompute check at an audit step without the guard's peers and own fingerprint"
            )
        k, cross_node = derangement_offset(ctx.nodes)
        target = (ctx.rank + k) % w
        recomputed_here = self._recompute(ctx.peers, ctx.peers.exchange(k), target)
        table = all_gather_int64(_wire(self._own(ctx)) + _wire(recomputed_here), ctx.device).tolist()
        n = 2 if self.gradients else 1
        reported = [_opinion(row[:n]) for row in table]
        recomputed = {(r + k) % w: _opinion(table[r][n:]) for r in range(w)}
        checker = {(r + k) % w: r for r in range(w)}
        disputed = [t for t in range(w) if not self._agree(reported[t], recomputed[t])]
        n_nodes = len(set(ctx.nodes))
        evidence: dict[str, Any] = {"offset": k, "cross_node": cross_node, "nodes_in_world": n_nodes}
        if self.sharded:
            evidence["compared"] = (
                "loss and local gradient (a sharded model: every rank at once)"
                if self.gradients
                else "loss (forward only: a sharded model whose local gradient the guard cannot see)"
            )
        if not disputed:
            self._add_time(ctx, t0)
            return CheckResult(
                check=self.name, step=ctx.step, verdict="pass", duration_s=self._clock(ctx), evidence=evidence
            )
        evidence["pairs"] = [
            {
                "checker": checker[t],
                "checker_node": ctx.nodes[checker[t]],
                "target": t,
                "target_node": ctx.nodes[t],
                "reported": _show(reported[t]),
                "recomputed": _show(recomputed[t]),
            }
            for t in disputed
        ]
        suspects, votes, attributable = self._vote(ctx, disputed, reported)
        evidence["votes"] = votes
        evidence["attributable"] = attributable
        if not attributable:
            evidence["why_unnamed"] = (
                f"{n_nodes} node(s): a strict majority needs at least 3 nodes"
                if n_nodes < 3
                else "no strict majority among the recomputed values"
            )
        self._add_time(ctx, t0)
        return CheckResult(
            check=self.name,
            step=ctx.step,
            verdict="fail",
            duration_s=self._clock(ctx),
            suspect_ranks=suspects if attributable else [],
            evidence=evidence,
        )

    def _vote(
        self, ctx: StepContext, disputed: list[int], reported: list[Opinion]
    ) -> tuple[list[int], dict[str, dict[str, dict[str, str]]], bool]:
        """Every rank recomputes every disputed micro-batch; a target's own report is its opinion (sharded,
        the target recomputes too, in step with the others, and keeps its report)."""
        assert ctx.peers is not None
        mine: list[int] = []
        for t in disputed:
            batch = ctx.peers.broadcast(t)  # a collective: every rank, every disputed target, in order
            if t != ctx.rank:
                mine += _wire(self._recompute(ctx.peers, batch, t))
                continue
            if self.sharded:
                self._recompute(ctx.peers, batch, t)  # FSDP's collectives need this rank
            mine += _wire(reported[t])
        table = all_gather_int64(mine, ctx.device).tolist()
        n = 2 if self.gradients else 1
        suspects: set[int] = set()
        votes: dict[str, dict[str, dict[str, str]]] = {}
        attributable = len(set(ctx.nodes)) >= 3
        for i, t in enumerate(disputed):
            opinions = [_opinion(row[n * i : n * (i + 1)]) for row in table]
            votes[str(t)] = {str(r): _show(o) for r, o in enumerate(opinions)}
            found, dissent = self._majority(opinions)
            if not found:
                attributable = False
            suspects.update(dissent)
        return sorted(suspects), votes, attributable

    def _majority(self, opinions: list[Opinion]) -> tuple[bool, list[int]]:
        if self.loss_rtol == 0:
            value, dissent = majority(opinions)
            return value is not None, dissent
        # With a tolerance, the majority is the largest group that agrees with one of its members.
        w = len(opinions)
        best = max(range(w), key=lambda i: sum(self._agree(opinions[i], o) for o in opinions))
        agree = [self._agree(opinions[best], o) for o in opinions]
        if 2 * sum(agree) <= w:
            return False, []
        return True, [r for r in range(w) if not agree[r]]


def _wire(opinion: Opinion) -> list[int]:
    """An opinion as int64 values for a gather (a fingerprint is unsigned)."""
    return [opinion[0], *(to_int64(v) for v in opinion[1:])]


def _opinion(row: list[int]) -> Opinion:
    return (row[0], *(from_int64(v) for v in row[1:]))


def _show(opinion: Opinion) -> dict[str, str]:
    shown = {"loss": repr(bits_loss(opinion[0]))}
    if len(opinion) > 1:
        shown["grad_fingerprint"] = hex64(opinion[1])
    return shown
