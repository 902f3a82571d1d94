"""What node_return's tasks hand each other, per node: the probe's outcome (`probe` -> `resume`,
`summary`) and the return's (`resume` -> `summary`). They travel as XCom objects; each task reads them
here once, so a wrong type is refused naming the field instead of surfacing as a wrong decision. Both are
parts in the records' sense (training/records/base.py `Part`): undeclared fields and nulls come back as
read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from training.records.base import Part
from training.records.fields import need, opt_bool, opt_int, opt_objects, opt_str, while_set


def _node(kind: str, obj: Mapping[str, Any], name: str) -> str:
    return str(need(kind, obj, name, opt_str))


def _flag(kind: str, obj: Mapping[str, Any], name: str) -> bool:
    """true or false; absent or null: false."""
    return bool(opt_bool(kind, obj, name))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)  # base.PART, spelled out for mypy
class NodeProbe(Part):
    """One node's probe (`returning.probe`, or the observe mode's stand-in, or a probe that could not run)."""

    KIND = ERROR_KIND = "node_probe"
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

    FIELDS = while_set(
        node=_node, clean=_flag, rounds=opt_objects, observe=opt_bool, why=opt_str, dcgm_level=opt_int
    )


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)  # base.PART, spelled out for mypy
class NodeReturn(Part):
    """One node's return (`returning.resume`, or the summary's note of a rejected approval)."""

    KIND = ERROR_KIND = "node_return"
    node: str
    returned: bool
    """Slurm resumed the node."""
    why: str | None = None
    """Why it was not returned."""
    observe: bool | None = None
    """True in observe mode: it would have been returned."""

    FIELDS = while_set(node=_node, returned=_flag, why=opt_str, observe=opt_bool)
