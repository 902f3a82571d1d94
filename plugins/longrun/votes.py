"""Agreement at each weight vote, from the check records: what the run-health page plots."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from training.records.job import CheckRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class Vote:
    """Agreement at one weight vote."""

    step: int
    agreeing: int
    """Replicas whose weight fingerprint equals the strict majority's."""
    replicas: int
    """Replicas that voted."""
    dissenters: tuple[int, ...] = ()
    """Ranks that differ from the majority."""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas = {self.replicas!r}: must be >= 1")
        if not 0 <= self.agreeing <= self.replicas:
            raise ValueError(f"agreeing = {self.agreeing!r}: must be in [0, replicas]")


def _sharded_vote(c: CheckRecord, replicas: int, shards: object) -> Vote:
    """A failed vote within replica groups (a sharded model): fingerprints compare only among a shard's
    holders, so agreement is every rank but the dissenters the per-shard majorities named; a shard without
    a majority (or evidence that does not read) means nobody agrees."""
    groups = list(shards.values()) if isinstance(shards, Mapping) else []
    if not groups or any(not isinstance(g, Mapping) or g.get("majority") is None for g in groups):
        return Vote(step=c.step, agreeing=0, replicas=replicas)
    dissent = sorted(
        {r for g in groups for r in (g.get("dissent") or ()) if isinstance(r, int) and 0 <= r < replicas}
    )
    return Vote(step=c.step, agreeing=replicas - len(dissent), replicas=replicas, dissenters=tuple(dissent))


def vote(c: CheckRecord, world: int | None) -> Vote | None:
    """Agreement at one weight vote: exact when the record lists every replica's fingerprint (failures
    do); a pass means every replica agreed; no strict majority means nobody agrees."""
    by_rank = c.fingerprints_by_rank
    shards = c.evidence.get("shards")
    if by_rank and "shards" in c.evidence:
        return _sharded_vote(c, len(by_rank), shards)
    if by_rank:
        top, n = Counter(by_rank.values()).most_common(1)[0]
        if 2 * n <= len(by_rank):
            return Vote(step=c.step, agreeing=0, replicas=len(by_rank))
        dissent = tuple(sorted(int(r) for r, v in by_rank.items() if v != top))
        return Vote(step=c.step, agreeing=n, replicas=len(by_rank), dissenters=dissent)
    replicas = c.replicas or world or 1
    if c.verdict == "pass":
        return Vote(step=c.step, agreeing=replicas, replicas=replicas)
    if c.verdict == "fail":
        return Vote(
            step=c.step,
            agreeing=max(0, replicas - len(c.suspect_ranks)),
            replicas=max(replicas, len(c.suspect_ranks)),
            dissenters=c.suspect_ranks,
        )
    return None
