"""Check 3: the weight vote. After the update every replica fingerprints its weights (xxh3-64 per tensor,
combined into one 64-bit value); one all-gather of one int64 per rank; a replica that differs from a
strict majority is the suspect. Runs every `every` steps and always right before a checkpoint save, so
a corrupted replica is never frozen into a checkpoint. The per-tensor fingerprints of a passing vote go
into the checkpoint manifest (the validator recomputes them from the stored tensors).
"""

from __future__ import annotations

import time

from training.checks.base import CheckBase, CheckResult, StepContext, majority
from training.dist import all_gather_int64
from training.fingerprint import combine, fingerprint_state, from_int64, hex64, to_int64


class WeightVoteCheck(CheckBase):
    name = "weight_vote"

    def __init__(self, *, every: int) -> None:
        self.every = every

    def due(self, step: int, *, saving: bool) -> bool:
        return saving or (self.every > 0 and step % self.every == 0)

    def after_update(self, ctx: StepContext) -> CheckResult | None:
        t0 = time.perf_counter()
        fps = fingerprint_state(ctx.model.state_dict())
        mine = int(combine(fps), 16)
        votes = [from_int64(v) for v in all_gather_int64([to_int64(mine)], ctx.device)[:, 0].tolist()]
        value, dissent = majority(votes)
        if value is not None and not dissent:
            self._add_time(ctx, t0)
            return CheckResult(
                check=self.name,
                step=ctx.step,
                verdict="pass",
                duration_s=self._clock(ctx),
                evidence={"fingerprint": hex64(mine)},
                extra={"fingerprints": fps, "votes": [hex64(v) for v in votes]},
            )
        # Which tensors differ: gather every replica's per-tensor fingerprints (only on failure).
        names = sorted(fps)
        table = all_gather_int64([to_int64(int(fps[n], 16)) for n in names], ctx.device).tolist()
        reference = table[votes.index(int(value))] if value is not None else table[0]  # type: ignore[call-overload]
        differing = {
            str(r): [names[i] for i, v in enumerate(row) if v != reference[i]] for r, row in enumerate(table)
        }
        self._add_time(ctx, t0)
        return CheckResult(
            check=self.name,
            step=ctx.step,
            verdict="fail",
            duration_s=self._clock(ctx),
            suspect_ranks=dissent,
            evidence={
                "fingerprints_by_rank": {str(r): hex64(v) for r, v in enumerate(votes)},
                "majority": hex64(int(value)) if value is not None else None,  # type: ignore[call-overload]
                "tensors_differing_from_majority": {r: d for r, d in differing.items() if d},
                "why_unnamed": None if value is not None else "no strict majority of replicas",
            },
        )
