"""Attribution: from an alert's evidence to one suspect node, or to "ambiguous".

A node is named only when the evidence points at exactly one node and a strict majority of the other
replicas agreed with each other. Everything else is ambiguous and suspects software (a non-deterministic
kernel, a bad code push, a data race): draining a healthy node for it would cost capacity and hide the
real cause, so the incident drains nothing, fails loudly and links the ambiguous-evidence runbook.

Ambiguous when:
- the alert names no node (e.g. a two-node recompute mismatch, where no majority exists);
- it names several nodes at once;
- every replica disagrees (no majority: the checks say so in the evidence, or every node is named); for a
  vote within replica groups (a sharded model) that is any disagreeing shard without a majority.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longrun.incident import runbooks
from training.records.alert import Alert

NODE = "node"
AMBIGUOUS = "ambiguous"

# Evidence keys under which the checks may say that no strict majority existed.
_NO_MAJORITY_KEYS = ("no_majority", "all_disagree", "every_replica_disagrees")


@dataclass(frozen=True, slots=True, kw_only=True)
class AttributionOutcome:
    """What the evidence lets us say about where the fault is; `to_dict` is the record's `attribution`,
    read back as training.records.Attribution."""

    verdict: str
    """`node` (one suspect node) or `ambiguous` (suspect software; drain nothing)."""
    node: str | None
    """The suspect node when verdict is `node`, else None."""
    ranks: tuple[int, ...]
    """The suspect ranks the alert named (may be empty)."""
    reason: str
    """One sentence for people: why this verdict."""
    runbook: str
    """The runbook to follow next (repository-relative path)."""

    def __post_init__(self) -> None:
        if self.verdict not in (NODE, AMBIGUOUS):
            raise ValueError(f"verdict={self.verdict!r}: expected {NODE!r} or {AMBIGUOUS!r}")
        if (self.verdict == NODE) != (self.node is not None):
            raise ValueError(f"node={self.node!r} does not fit verdict={self.verdict!r}")

    @property
    def ambiguous(self) -> bool:
        return self.verdict == AMBIGUOUS

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "node": self.node,
            "ranks": list(self.ranks),
            "reason": self.reason,
            "runbook": self.runbook,
        }


def _vote_without_majority(evidence: Mapping[str, Any]) -> bool:
    """Whether a weight vote's evidence says no strict majority existed. A vote within replica groups (a
    sharded model: `shards`, one entry per shard whose holders disagreed) has no whole-model `majority`
    by design; it had one where every disagreeing shard's group had a strict majority. Anything else
    under `shards` (not a non-empty object of objects) counts as no majority: evidence that does not read
    never names a node."""
    if "shards" not in evidence:
        return "majority" in evidence and evidence["majority"] is None
    shards = evidence["shards"]
    if not isinstance(shards, Mapping) or not shards:
        return True
    return any(not isinstance(g, Mapping) or g.get("majority") is None for g in shards.values())


def attribute(alert: Mapping[str, Any] | Alert) -> AttributionOutcome:
    """Attribute an alert record (training.records.schema kind `alert`) to one node, or call it ambiguous.
    A record that does not read as an alert raises SchemaError (a ValueError) naming the field."""
    a = alert if isinstance(alert, Alert) else Alert.from_json(alert)
    check, step, evidence = a.check, a.step, a.evidence
    ranks = a.suspect_ranks
    world = list(a.rank_nodes)
    named = list(a.suspect_nodes)
    if not named and ranks and world:
        # A check that only knew ranks: map them through the rank -> node table it recorded.
        named = [world[r] for r in ranks if 0 <= r < len(world)]
    nodes = list(dict.fromkeys(named))

    def ambiguous(reason: str) -> AttributionOutcome:
        return AttributionOutcome(
            verdict=AMBIGUOUS, node=None, ranks=ranks, reason=reason, runbook=runbooks.AMBIGUOUS_EVIDENCE
        )

    # The checks say "no strict majority" as a flag, as a weight vote without a majority value, or as
    # a recompute dispute they could not attribute.
    no_majority = any(evidence.get(k) for k in _NO_MAJORITY_KEYS) or _vote_without_majority(evidence)
    if no_majority:
        return ambiguous(f"{check} at step {step}: every replica disagrees (no strict majority)")
    if evidence.get("attributable") is False:
        why = evidence.get("why_unnamed") or "the dispute cannot be attributed"
        return ambiguous(f"{check} at step {step}: the evidence names no node ({why})")
    distinct_world = list(dict.fromkeys(world))
    if len(distinct_world) > 1 and set(nodes) >= set(distinct_world):
        return ambiguous(f"{check} at step {step}: every node of the run is suspect ({nodes})")
    if not nodes:
        return ambiguous(f"{check} at step {step}: the evidence names no node")
    if len(nodes) > 1:
        return ambiguous(f"{check} at step {step}: the evidence names several nodes at once {nodes}")
    return AttributionOutcome(
        verdict=NODE,
        node=nodes[0],
        ranks=ranks,
        reason=f"{check} at step {step}: ranks {list(ranks)} on {nodes[0]} disagree with the majority",
        runbook=runbooks.for_check(check),
    )
