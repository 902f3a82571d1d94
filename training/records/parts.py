"""What the parts of an incident record share. The parts (the attribution, the drain, the diagnosis, the
restart checkpoint, the relaunch: training/records/incident.py and diagnosis.py) are also what
sdc_incident's steps return through XCom. Field meanings are in docs/contracts.md and the steps' modules.

A part is read once where it crosses a boundary (the record from the store, a step's result from XCom):
`from_json` checks the type of every field the part declares and refuses a wrong one with a SchemaError
that names the part and the field; a field it does not declare stays in `extra`, and a declared field
the writer set to null is remembered, so `to_json` gives back the object it read. Every field is
optional: a record written by older code may lack any of them, and an absent part is the empty one
(false, `to_json() == {}`).

Readers use the attributes. Two parts are equal when their JSON is; an empty part is false.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from training.records.base import Reader, ints, opt_int
from training.schema import SchemaError


def opt_obj(kind: str, obj: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """An optional object field kept as it is (absent or null: None)."""
    v = obj.get(name)
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise SchemaError(f"{kind} record field {name!r} = {v!r:.80} is not an object")
    return dict(v)


def opt_ints(kind: str, obj: Mapping[str, Any], name: str) -> tuple[int, ...] | None:
    v = obj.get(name)
    return None if v is None else ints(kind, name, v)


def opt_job_id(kind: str, obj: Mapping[str, Any], name: str) -> int | str | None:
    """A Slurm job id: an integer, or its text."""
    v = obj.get(name)
    if v is None or isinstance(v, str):
        return v
    return opt_int(kind, obj, name)


class Part:
    """Mixin of the parts: `PART` names it in errors, `READ` maps each declared field (in the order the
    writers write them) to its reader; the dataclass adds the fields, `nulls` and `extra`."""

    __slots__ = ()
    PART: ClassVar[str]
    READ: ClassVar[Mapping[str, Reader]]

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        """Read a part from a decoded JSON object; raises SchemaError naming the field."""
        kind = f"incident {cls.PART}"
        if not isinstance(obj, Mapping):
            raise SchemaError(f"{kind} = {obj!r:.80} is not an object")
        args: dict[str, Any] = {name: read(kind, obj, name) for name, read in cls.READ.items()}
        args["nulls"] = frozenset(k for k in cls.READ if k in obj and obj[k] is None)
        args["extra"] = {k: v for k, v in obj.items() if k not in cls.READ}
        return cls(**args)

    @classmethod
    def read(cls, kind: str, obj: Mapping[str, Any], name: str) -> Self | None:
        """A `Reader` of the part as a field of `obj` (absent or null: None)."""
        v = opt_obj(kind, obj, name)
        return None if v is None else cls.from_json(v)

    @classmethod
    def read_or_empty(cls, kind: str, obj: Mapping[str, Any], name: str) -> Self:
        """A `Reader` of the part as a field of `obj` (absent or null: the empty part)."""
        return cls.read(kind, obj, name) or cls()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.READ:
            v = getattr(self, name)
            if v is not None or name in self.nulls:  # type: ignore[attr-defined]
                out[name] = v.to_json() if isinstance(v, Part) else list(v) if isinstance(v, tuple) else v
        for k, v in self.extra.items():  # type: ignore[attr-defined]
            out.setdefault(k, v)
        return out

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_json() == other.to_json()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # equal by value, and extra holds a dict

    def __bool__(self) -> bool:
        return bool(self.to_json())


PART = dataclass(frozen=True, slots=True, kw_only=True, eq=False)
"""The dataclass decorator of a part (eq=False: parts compare by their JSON, Part.__eq__)."""


__all__ = ["PART", "Part", "opt_ints", "opt_job_id", "opt_obj"]
