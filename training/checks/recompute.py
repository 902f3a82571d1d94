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
"""

from __future__ import annotations

import math
import time
from typing import Any

from training.checks.base import CheckBase, CheckResult, StepContext, bits_loss, loss_bits, majority
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


class RecomputeCheck(CheckBase):
    name = "recompute"

    def __init__(self, *, every: int, loss_rtol: float = 0.0) -> None:
        self.every, self.loss_rtol = every, loss_rtol

    def due(self, step: int, *, saving: bool) -> bool:
        return self.every > 0 and step % self.every == 0

    def _agree(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        if self.loss_rtol == 0:
            return a == b
        la, lb = bits_loss(a[0]), bits_loss(b[0])
        return math.isclose(la, lb, rel_tol=self.loss_rtol, abs_tol=0.0)

    def after_reduce(self, ctx: StepContext) -> CheckResult | None:
        w = ctx.world_size
        if w < 2:
            return None
        t0 = time.perf_counter()
        if ctx.peers is None or ctx.own_grad_fingerprint is None:
            raise RuntimeError(
                "recompute check at an audit step without the guard's peers and own fingerprint"
            )
        k, cross_node = derangement_offset(ctx.nodes)
        target = (ctx.rank + k) % w
        loss, fp = ctx.peers.recompute(ctx.peers.exchange(k), target)
        mine = [loss_bits(ctx.loss), to_int64(ctx.own_grad_fingerprint), loss_bits(loss), to_int64(fp)]
        table = all_gather_int64(mine, ctx.device).tolist()
        reported = [(row[0], from_int64(row[1])) for row in table]
        recomputed = {(r + k) % w: (table[r][2], from_int64(table[r][3])) for r in range(w)}
        checker = {(r + k) % w: r for r in range(w)}
        disputed = [t for t in range(w) if not self._agree(reported[t], recomputed[t])]
        n_nodes = len(set(ctx.nodes))
        evidence: dict[str, Any] = {"offset": k, "cross_node": cross_node, "nodes_in_world": n_nodes}
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
        self, ctx: StepContext, disputed: list[int], reported: list[tuple[int, int]]
    ) -> tuple[list[int], dict[str, dict[str, dict[str, str]]], bool]:
        """Every rank recomputes every disputed micro-batch; a target's own report is its opinion."""
        assert ctx.peers is not None
        mine: list[int] = []
        for t in disputed:
            batch = ctx.peers.broadcast(t)  # a collective: every rank, every disputed target, in order
            if t == ctx.rank:
                loss_b, fp = reported[t]
            else:
                loss, fp = ctx.peers.recompute(batch, t)
                loss_b = loss_bits(loss)
            mine += [loss_b, to_int64(fp)]
        table = all_gather_int64(mine, ctx.device).tolist()
        suspects: set[int] = set()
        votes: dict[str, dict[str, dict[str, str]]] = {}
        attributable = len(set(ctx.nodes)) >= 3
        for i, t in enumerate(disputed):
            opinions = [(row[2 * i], from_int64(row[2 * i + 1])) for row in table]
            votes[str(t)] = {str(r): _show(o) for r, o in enumerate(opinions)}
            found, dissent = self._majority(opinions)
            if not found:
                attributable = False
            suspects.update(dissent)
        return sorted(suspects), votes, attributable

    def _majority(self, opinions: list[tuple[int, int]]) -> tuple[bool, list[int]]:
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


def _show(opinion: tuple[int, int]) -> dict[str, str]:
    return {"loss": repr(bits_loss(opinion[0])), "grad_fingerprint": hex64(opinion[1])}
