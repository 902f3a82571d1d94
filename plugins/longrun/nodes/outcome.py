"""What node_return's tasks hand each other, per node: the probe's outcome (`probe` -> `resume`,
`summary`) and the return's (`resume` -> `summary`). They travel as XCom objects; each task reads them
here once, so a wrong type is refused naming the field instead of surfacing as a wrong decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from training.records.base import need, opt_bool, opt_int, opt_objects, opt_str
from training.schema import SchemaError


def _extra(obj: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in known}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeProbe:
    """One node's probe (`returning.probe`, or the observe mode's stand-in, or a probe that could not run)."""

    KIND = "node_probe"
    node: str
    clean: bool
    """Every round passed."""
    rounds: tuple[dict[str, Any], ...] = ()
    """Each round's `round`, `verdict`, `summary`, `reason`."""
    observe: bool | None = None
    """True in observe mode: nothing was probed."""
    why: str | None = None
    """Why the probe could not run."""
    dcgm_level: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        if not isinstance(obj, Mapping):
            raise SchemaError(f"{cls.KIND} record must be a JSON object, got {type(obj).__name__}")
        return cls(
            node=need(cls.KIND, obj, "node", opt_str),
            clean=bool(opt_bool(cls.KIND, obj, "clean")),
            rounds=opt_objects(cls.KIND, obj, "rounds"),
            observe=opt_bool(cls.KIND, obj, "observe"),
            why=opt_str(cls.KIND, obj, "why"),
            dcgm_level=opt_int(cls.KIND, obj, "dcgm_level"),
            extra=_extra(obj, ("node", "clean", "rounds", "observe", "why", "dcgm_level")),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "clean": self.clean, "rounds": list(self.rounds)}
        for name in ("observe", "why", "dcgm_level"):
            if (v := getattr(self, name)) is not None:
                out[name] = v
        return {**out, **self.extra}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeReturn:
    """One node's return (`returning.resume`, or the summary's note of a rejected approval)."""

    KIND = "node_return"
    node: str
    returned: bool
    """Slurm resumed the node."""
    why: str | None = None
    """Why it was not returned."""
    observe: bool | None = None
    """True in observe mode: it would have been returned."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        if not isinstance(obj, Mapping):
            raise SchemaError(f"{cls.KIND} record must be a JSON object, got {type(obj).__name__}")
        return cls(
            node=need(cls.KIND, obj, "node", opt_str),
            returned=bool(opt_bool(cls.KIND, obj, "returned")),
            why=opt_str(cls.KIND, obj, "why"),
            observe=opt_bool(cls.KIND, obj, "observe"),
            extra=_extra(obj, ("node", "returned", "why", "observe")),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "returned": self.returned}
        for name in ("why", "observe"):
            if (v := getattr(self, name)) is not None:
                out[name] = v
        return {**out, **self.extra}
