"""Check 3: the weight vote. After the update every replica fingerprints its weights (one 64-bit value per
tensor, combined into one); one all-gather of one int64 per rank; a replica that differs from a strict
majority is the suspect. Runs every `every` steps and always right before a checkpoint save, so a
corrupted replica is never frozen into a checkpoint.

The fingerprint follows the weights' device (`algorithm_for`): xxh3-64 on CPU, where it is the faster
one, and the device-side dfp64 (training.fingerprint.device) on CUDA, so only 8 bytes per replica leave
the GPU instead of every weight. On CPU the per-tensor xxh3 fingerprints of a passing vote go into the
checkpoint manifest (the validator recomputes them from the stored tensors); on CUDA the saver computes
the manifest's xxh3 from its host snapshot, off the training step.
"""

from __future__ import annotations

import time

import torch

from training.checks.base import CheckBase, CheckResult, StepContext, majority
from training.dist import all_gather_int64
from training.fingerprint import device as dfp
from training.fingerprint.host import combine, fingerprint_state, from_int64, hex64, to_int64

XXH3 = "xxh3-64"
ALGORITHMS = (XXH3, dfp.ALGORITHM)


def algorithm_for(device: torch.device) -> str:
    """xxh3-64 where the weights are in host memory, dfp64 where they are on an accelerator."""
    return XXH3 if device.type == "cpu" else dfp.ALGORITHM


class WeightVoteCheck(CheckBase):
    name = "weight_vote"

    def __init__(self, *, every: int, algorithm: str | None = None) -> None:
        if algorithm is not None and algorithm not in ALGORITHMS:
            raise ValueError(
                f"WeightVoteCheck.algorithm = {algorithm!r}; expected one of {ALGORITHMS} or None"
            )
        self.every = every
        self.algorithm = algorithm
        """None: chosen by the weights' device (`algorithm_for`)."""

    def due(self, step: int, *, saving: bool) -> bool:
        return saving or (self.every > 0 and step % self.every == 0)

    def _vote(
        self, ctx: StepContext
    ) -> tuple[str, list[int], dict[str, str] | None, list[str], torch.Tensor]:
        """(algorithm, every replica's combined value, this replica's per-tensor hex for the manifest or
        None, tensor names, this replica's per-tensor int64 values)."""
        state = ctx.model.state_dict()
        algo = self.algorithm or algorithm_for(ctx.device)
        if algo == XXH3:
            fps = fingerprint_state(state)
            names = sorted(fps)
            per = torch.tensor([to_int64(int(fps[n], 16)) for n in names], dtype=torch.int64)
            gathered = all_gather_int64([to_int64(int(combine(fps), 16))], ctx.device)
            return algo, [from_int64(v) for v in gathered[:, 0].tolist()], fps, names, per
        names, per, combined = dfp.fingerprint_state_device(state)
        gathered = _gather(combined.reshape(1))  # the only copy to the host: 8 bytes per replica
        return algo, [from_int64(v) for v in gathered[:, 0].tolist()], None, names, per

    def after_update(self, ctx: StepContext) -> CheckResult | None:
        t0 = time.perf_counter()
        algo, votes, fps, names, per = self._vote(ctx)
        mine = votes[ctx.rank]
        value, dissent = majority(votes)
        if value is not None and not dissent:
            self._add_time(ctx, t0)
            extra: dict[str, object] = {"votes": [hex64(v) for v in votes], "algorithm": algo}
            if fps is not None:
                extra["fingerprints"] = fps
            return CheckResult(
                check=self.name,
                step=ctx.step,
                verdict="pass",
                duration_s=self._clock(ctx),
                evidence={"fingerprint": hex64(mine), "algorithm": algo},
                extra=extra,
            )
        # Which tensors differ: gather every replica's per-tensor fingerprints (only on failure).
        table = _gather(per.to(ctx.device)).tolist()
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
                "algorithm": algo,
            },
        )


def _gather(t: torch.Tensor) -> torch.Tensor:
    """All-gather a 1-D int64 tensor from every rank where it lives: a (world, len) tensor on the CPU."""
    import torch.distributed as tdist

    parts = [torch.empty_like(t) for _ in range(tdist.get_world_size())]
    tdist.all_gather(parts, t)
    return torch.stack(parts).cpu()
