"""The alert record (one SDC verdict, the orchestrator's trigger), its tolerant copy, and the world it names.
Field meanings are in docs/contracts.md; `extra` keeps what a newer writer added."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from training.records.base import Record
from training.records.fields import ints_of, opt_bool, opt_int, schema_fields, strs, strs_of
from training.records.schema import SchemaError


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    """Who trained: the nodes, each rank's node, and the number of replicas."""

    world_size: int | None = None
    """Replicas (ranks); None when the record does not say."""
    nodes: tuple[str, ...] = ()
    """Distinct node names, sorted."""
    ranks: tuple[str, ...] = ()
    """Node of each rank, by rank."""

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        """Read a manifest's `world` or an alert's `evidence.world`. Older writers said `size`, or gave
        `ranks` as a count; both still read."""
        if not isinstance(obj, Mapping):
            raise SchemaError(f"world = {obj!r:.80} is not an object")
        size = obj.get("world_size", obj.get("size"))
        ranks = obj.get("ranks")
        if isinstance(ranks, int) and not isinstance(ranks, bool):
            size, ranks = size if size is not None else ranks, ()
        rank_nodes = strs("world", "ranks", ranks or ())
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise SchemaError(f"world field 'world_size' = {size!r:.80} is not a positive integer")
        return cls(
            world_size=size if size is not None else (len(rank_nodes) or None),
            nodes=strs("world", "nodes", obj.get("nodes") or ()),
            ranks=rank_nodes,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodes": list(self.nodes), "ranks": list(self.ranks)}
        if self.world_size is not None:
            out["world_size"] = self.world_size
        return out


#: Where alerts have carried the node of every rank (see `Alert.rank_nodes`).
_RANK_NODE_KEYS = ("nodes", "rank_nodes", "world_nodes")


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertRef:
    """What a reader that must not fail takes from a copy of an alert (an incident's `alert`, which may be
    partial or older): each field of the right type, or empty. The whole record is `Alert`."""

    step: int | None = None
    check: str | None = None
    suspect_nodes: tuple[str, ...] = ()
    time: float | None = None
    """When the job raised it (epoch seconds), a number as written."""
    world_size: int | None = None
    """The replicas the evidence names (`evidence.world.world_size`), when a positive integer."""

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        """Never raises: a field that is absent or not of its type reads as empty."""
        if not isinstance(obj, Mapping):
            return cls()
        step, check, nodes = obj.get("step"), obj.get("check"), obj.get("suspect_nodes")
        t = obj.get("time")
        evidence = obj.get("evidence")
        world = evidence.get("world") if isinstance(evidence, Mapping) else None
        size = world.get("world_size") if isinstance(world, Mapping) else None
        return cls(
            step=step if isinstance(step, int) and not isinstance(step, bool) else None,
            check=check if isinstance(check, str) else None,
            suspect_nodes=tuple(str(n) for n in nodes) if isinstance(nodes, list | tuple) else (),
            time=t if isinstance(t, int | float) and not isinstance(t, bool) else None,
            world_size=size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert(Record):
    """One SDC verdict: the orchestrator's trigger."""

    KIND = "alert"
    run: str
    step: int
    check: str
    """`finite`, `recompute` or `weight_vote`."""
    suspect_ranks: tuple[int, ...]
    suspect_nodes: tuple[str, ...]
    evidence: Mapping[str, Any]
    """What the check saw (losses, fingerprints, `world`); its shape depends on the check."""
    time: float
    update_applied: bool | None = None
    """True when the step's update was applied before the verdict (the weight vote runs after it)."""
    exit_code: int | None = None
    FIELDS = schema_fields(
        KIND, suspect_ranks=ints_of, suspect_nodes=strs_of, update_applied=opt_bool, exit_code=opt_int
    )

    @property
    def world(self) -> World | None:
        """The world the alert's evidence names, or None when it names none."""
        w = self.evidence.get("world")
        return World.from_json(w) if isinstance(w, Mapping) else None

    @property
    def rank_nodes(self) -> tuple[str, ...]:
        """The node of every rank, in rank order, when the alert carries it; empty when it does not.

        Checks have written it under several names over time: `nodes`, `rank_nodes` or `world_nodes`,
        in `evidence.world`, in the evidence itself, or (older writers) beside it. The first non-empty
        list wins, in that order."""
        for source in (self.evidence.get("world"), self.evidence, self.extra.get("world"), self.extra):
            for key in _RANK_NODE_KEYS:
                value = source.get(key) if isinstance(source, Mapping) else None
                if isinstance(value, list | tuple) and value:
                    return tuple(str(v) for v in value)
        return ()

    @property
    def evidence_nodes(self) -> tuple[str, ...]:
        """The nodes the job ran on as the evidence lists them (`evidence.nodes`); empty when it lists
        none. `rank_nodes` is the node of every rank, wherever the alert carries it."""
        v = self.evidence.get("nodes")
        return tuple(str(n) for n in v) if isinstance(v, list | tuple) else ()

    @property
    def fingerprints_by_rank(self) -> dict[str, str]:
        """The weight vote's fingerprint of every replica, when the evidence lists them."""
        by_rank = self.evidence.get("fingerprints_by_rank")
        return dict(by_rank) if isinstance(by_rank, Mapping) else {}


__all__ = ["Alert", "AlertRef", "World"]
