"""Check 3: the weight vote. After the update every replica fingerprints its weights (one 64-bit value per
tensor, combined into one); one all-gather of one int64 per rank; a replica that differs from a strict
majority is the suspect. Runs every `every` steps and always right before a checkpoint save, so a
corrupted replica is never frozen into a checkpoint.

The fingerprint follows the weights' device (`algorithm_for`): xxh3-64 on CPU, where it is the faster
one, and the device-side dfp64 (training.fingerprint.device) on CUDA, so only 8 bytes per replica leave
the GPU instead of every weight. On CPU the per-tensor xxh3 fingerprints of a passing vote go into the
checkpoint manifest (the validator recomputes them from the stored tensors); on CUDA the saver computes
the manifest's xxh3 from its host snapshot, off the training step.

Sharded weights (FSDP2, HSDP): each rank fingerprints its local shards (a `DTensor`'s `to_local()`), and
the vote runs within each group of ranks that hold the same shard (training.checks.replicas.ReplicaLayout);
the gather is still one int64 per rank over the world, and every rank derives the same per-group verdict
from it. A group of two can see a difference but not name a side; three or more name the dissenter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from training.checks.base import CheckBase, CheckResult, StepContext, majority
from training.checks.replicas import ReplicaLayout
from training.dist import all_gather_int64
from training.fingerprint import device as dfp
from training.fingerprint.host import combine, fingerprint_state, from_int64, hex64, local_state, to_int64

XXH3 = "xxh3-64"
ALGORITHMS = (XXH3, dfp.ALGORITHM)


def algorithm_for(device: torch.device) -> str:
    """xxh3-64 where the weights are in host memory, dfp64 where they are on an accelerator."""
    return XXH3 if device.type == "cpu" else dfp.ALGORITHM


class WeightVoteCheck(CheckBase):
    name = "weight_vote"

    def __init__(
        self, *, every: int, algorithm: str | None = None, layout: ReplicaLayout | None = None
    ) -> None:
        if algorithm is not None and algorithm not in ALGORITHMS:
            raise ValueError(
                f"WeightVoteCheck.algorithm = {algorithm!r}; expected one of {ALGORITHMS} or None"
            )
        if layout is not None and not layout.votable:
            raise ValueError(
                f"WeightVoteCheck.layout is {layout.describe()}: no shard is held by two ranks, so a weight"
                " vote compares nothing; replicate the shards (HSDP) or leave the vote off"
            )
        self.every = every
        self.algorithm = algorithm
        """None: chosen by the weights' device (`algorithm_for`)."""
        self.layout = layout
        """Which ranks hold the same weights; None: every rank holds the whole model (DDP)."""

    def due(self, step: int, *, saving: bool) -> bool:
        return saving or (self.every > 0 and step % self.every == 0)

    def _vote(
        self, ctx: StepContext
    ) -> tuple[str, list[int], dict[str, str] | None, list[str], torch.Tensor]:
        """(algorithm, every replica's combined value, this replica's per-tensor hex for the manifest or
        None, tensor names, this replica's per-tensor int64 values)."""
        state = local_state(ctx.model.state_dict())
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
        layout = self.layout or ReplicaLayout.ddp(len(votes))
        if layout.world_size != len(votes):
            raise ValueError(f"the vote's layout is {layout.describe()}, the world has {len(votes)} ranks")
        mine = votes[ctx.rank]
        groups = [_group_vote(layout.holders(s), votes) for s in range(layout.shards)]
        if all(g.agreed for g in groups):
            self._add_time(ctx, t0)
            extra: dict[str, object] = {"votes": [hex64(v) for v in votes], "algorithm": algo}
            if fps is not None and self.layout is None:  # whole tensors: the manifest's fingerprints
                extra["fingerprints"] = fps
            return CheckResult(
                check=self.name,
                step=ctx.step,
                verdict="pass",
                duration_s=self._clock(ctx),
                evidence={"fingerprint": hex64(mine), "algorithm": algo},
                extra=extra,
            )
        evidence, dissent = _failure(
            layout, groups, votes, algo, table=_gather(per.to(ctx.device)), names=names
        )
        if self.layout is None:  # the record's layout as before sharding: no shard breakdown
            evidence.pop("layout")
            evidence.pop("shards")
        self._add_time(ctx, t0)
        return CheckResult(
            check=self.name,
            step=ctx.step,
            verdict="fail",
            duration_s=self._clock(ctx),
            suspect_ranks=dissent,
            evidence=evidence,
        )


def _failure(
    layout: ReplicaLayout,
    groups: list[_GroupVote],
    votes: list[int],
    algo: str,
    *,
    table: torch.Tensor,
    names: list[str],
) -> tuple[dict[str, object], list[int]]:
    """(evidence, suspect ranks) of a failed vote. Which tensors differ: every rank's per-tensor
    fingerprints (`table`, gathered only on failure) against a holder of its group's majority (or the
    group's first rank, without one)."""
    rows = table.tolist()
    reference = {r: rows[g.reference] for g in groups for r in g.ranks}
    differing = {
        str(r): [names[i] for i, v in enumerate(row) if v != reference[r][i]] for r, row in enumerate(rows)
    }
    undecided = [s for s, g in enumerate(groups) if not g.agreed and g.majority is None]
    whole = groups[0].majority if layout.shards == 1 else None
    evidence: dict[str, object] = {
        "fingerprints_by_rank": {str(r): hex64(v) for r, v in enumerate(votes)},
        "majority": hex64(whole) if whole is not None else None,
        "tensors_differing_from_majority": {r: d for r, d in differing.items() if d},
        "why_unnamed": (
            None
            if not undecided
            else "no strict majority of replicas"
            + ("" if layout.shards == 1 else f" for shard(s) {undecided}")
        ),
        "algorithm": algo,
        "layout": layout.describe(),
        "shards": {
            str(s): {
                "ranks": g.ranks,
                "majority": hex64(g.majority) if g.majority is not None else None,
                "dissent": g.dissent,
            }
            for s, g in enumerate(groups)
            if not g.agreed
        },
    }
    return evidence, sorted(r for g in groups for r in g.dissent)


@dataclass(frozen=True, slots=True)
class _GroupVote:
    """The vote among the ranks that hold one shard."""

    ranks: list[int]
    """The group's global ranks."""
    majority: int | None
    """The value a strict majority of the group holds, None without one."""
    dissent: list[int]
    """Global ranks that differ from that majority (empty without one)."""
    agreed: bool
    """Every rank of the group holds the same value."""

    @property
    def reference(self) -> int:
        """A rank holding the majority's value (the group's first rank without one)."""
        return next((r for r in self.ranks if r not in self.dissent), self.ranks[0])


def _group_vote(ranks: list[int], votes: list[int]) -> _GroupVote:
    values = [votes[r] for r in ranks]
    value, dissent_idx = majority(values)
    return _GroupVote(
        ranks=ranks,
        majority=value if isinstance(value, int) else None,
        dissent=[ranks[i] for i in dissent_idx],
        agreed=len(set(values)) == 1,
    )


def _gather(t: torch.Tensor) -> torch.Tensor:
    """All-gather a 1-D int64 tensor from every rank where it lives: a (world, len) tensor on the CPU."""
    import torch.distributed as tdist

    parts = [torch.empty_like(t) for _ in range(tdist.get_world_size())]
    tdist.all_gather(parts, t)
    return torch.stack(parts).cpu()
