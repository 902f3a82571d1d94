"""What every typed record shares: the kind and version stamp, validation on the way in, unknown fields
kept on the way through.

A record class is a frozen dataclass with a `KIND`. `from_json` checks the object against the kind's
required fields (`training.schema.validate`, one table for every reader) and the types of the optional
fields the class declares, then builds the instance; a field it does not declare is kept in `extra`, so a
record read and written again loses nothing a newer writer added. `to_json` gives the JSON object back,
stamped with `schema_version` and `kind`. Every error is a `SchemaError` (a ValueError) naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, Self

from training import schema
from training.schema import SchemaError

_STAMP = ("schema_version", "kind")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def opt_int(kind: str, obj: Mapping[str, Any], field: str) -> int | None:
    """An optional integer field (absent or null: None)."""
    v = obj.get(field)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise SchemaError(f"{kind} record field {field!r} = {v!r:.80} is not an integer")
    return v


def opt_float(kind: str, obj: Mapping[str, Any], field: str) -> float | None:
    """An optional number field (absent or null: None)."""
    v = obj.get(field)
    if v is None:
        return None
    if not _is_number(v):
        raise SchemaError(f"{kind} record field {field!r} = {v!r:.80} is not a number")
    return float(v)


def opt_str(kind: str, obj: Mapping[str, Any], field: str) -> str | None:
    v = obj.get(field)
    if v is None:
        return None
    if not isinstance(v, str):
        raise SchemaError(f"{kind} record field {field!r} = {v!r:.80} is not a string")
    return v


def opt_bool(kind: str, obj: Mapping[str, Any], field: str) -> bool | None:
    v = obj.get(field)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise SchemaError(f"{kind} record field {field!r} = {v!r:.80} is not true or false")
    return v


def opt_dict(kind: str, obj: Mapping[str, Any], field: str) -> dict[str, Any]:
    """An optional object field (absent or null: empty)."""
    v = obj.get(field)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise SchemaError(f"{kind} record field {field!r} = {v!r:.80} is not an object")
    return v


def opt_objects(kind: str, obj: Mapping[str, Any], field: str) -> tuple[dict[str, Any], ...]:
    """An optional list-of-objects field, each object kept as written (absent or null: empty)."""
    v = obj.get(field)
    if v is None:
        return ()
    if not isinstance(v, list | tuple) or not all(isinstance(x, dict) for x in v):
        raise SchemaError(f"{kind} record field {field!r} = {v!r:.80} is not a list of objects")
    return tuple(v)


def ints(kind: str, field: str, values: Any) -> tuple[int, ...]:
    if not isinstance(values, list | tuple) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise SchemaError(f"{kind} record field {field!r} = {values!r:.80} is not a list of integers")
    return tuple(values)


def strs(kind: str, field: str, values: Any) -> tuple[str, ...]:
    if not isinstance(values, list | tuple) or not all(isinstance(v, str) for v in values):
        raise SchemaError(f"{kind} record field {field!r} = {values!r:.80} is not a list of strings")
    return tuple(values)


def opt_strs(kind: str, obj: Mapping[str, Any], field: str) -> tuple[str, ...] | None:
    """An optional list-of-strings field (absent or null: None)."""
    v = obj.get(field)
    return None if v is None else strs(kind, field, v)


Reader = Callable[[str, Mapping[str, Any], str], Any]
"""Reads one optional field: (kind, object, field name) -> value, or raises SchemaError."""


def need(kind: str, obj: Mapping[str, Any], field: str, read: Reader) -> Any:
    """A required field: absent or null is refused, anything else is read with `read` (an `opt_*`)."""
    if obj.get(field) is None:
        raise SchemaError(f"{kind} record lacks field {field!r}")
    return read(kind, obj, field)


def stamped(kind: str, raw: Any, version: int) -> dict[str, Any]:
    """The object of a record whose class is a dataclass of its own (not a `Record`): JSON text or an
    object, stamped with `kind` and a `schema_version` this reader knows (1..`version`)."""
    obj = _object(kind, raw)
    if obj.get("kind") != kind:
        raise SchemaError(f"{kind} record field 'kind' = {obj.get('kind')!r}; expected {kind!r}")
    return _known_version(kind, obj, version)


def versioned(kind: str, raw: Any, version: int) -> dict[str, Any]:
    """`stamped` for a kind whose `kind` field is data, not a stamp (a node event's names the event): the
    object with a `schema_version` this reader knows; `kind` here only names the record in errors."""
    return _known_version(kind, _object(kind, raw), version)


def _object(kind: str, raw: Any) -> dict[str, Any]:
    obj = json.loads(raw) if isinstance(raw, str | bytes) else raw  # bad JSON: a ValueError too
    if not isinstance(obj, Mapping):
        raise SchemaError(f"{kind} record must be a JSON object, got {type(obj).__name__}")
    return dict(obj)


def _known_version(kind: str, obj: dict[str, Any], version: int) -> dict[str, Any]:
    v = obj.get("schema_version")
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= version:
        raise SchemaError(f"{kind} record field 'schema_version' = {v!r}; this reader knows 1..{version}")
    return obj


class RecordType(Protocol):
    """What every record class offers, `Record`'s subclasses and the kinds that are dataclasses of their
    own alike: `from_json` validates (a ValueError naming the field) and builds; `to_json` gives the
    object back as it is stored."""

    @classmethod
    def from_json(cls, obj: Any, /) -> Any: ...

    def to_json(self) -> dict[str, Any]: ...


class Record:
    """Mixin of the record dataclasses: `KIND`, `from_json`, `to_json`, `extra`.

    A class declares its required fields (those of `schema._REQUIRED`, taken as validated; numbers become
    floats), its optional ones in `OPTIONAL` (field -> reader), and converts the rest in `_convert`."""

    KIND: ClassVar[str]
    OPTIONAL: ClassVar[Mapping[str, Reader]] = {}

    @classmethod
    def _convert(cls, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Constructor arguments that need more than the generic reading (nested records, tuples)."""
        return {}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        """Validate a decoded JSON object and build the record; raises SchemaError naming the field."""
        schema.validate(cls.KIND, obj)
        if obj.get("kind", cls.KIND) != cls.KIND:
            raise SchemaError(f"{cls.KIND} record field 'kind' = {obj.get('kind')!r}; expected {cls.KIND!r}")
        declared = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        args: dict[str, Any] = {}
        for name, typ in schema._REQUIRED[cls.KIND].items():
            if name in declared:
                v = obj[name]
                args[name] = float(v) if typ in _NUMBER and v is not None and not isinstance(v, bool) else v
        args.update({name: read(cls.KIND, obj, name) for name, read in cls.OPTIONAL.items()})
        args.update(cls._convert(obj))
        args["schema_version"] = obj["schema_version"]
        args["extra"] = {k: v for k, v in obj.items() if k not in declared and k not in _STAMP}
        return cls(**args)

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the stamp, the declared fields (tuples as lists, nested records as objects),
        then the extra fields."""
        out: dict[str, Any] = {"schema_version": self.schema_version, "kind": self.KIND}  # type: ignore[attr-defined]
        required = schema._REQUIRED[self.KIND]
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name in ("schema_version", "extra"):
                continue
            value = getattr(self, f.name)
            if _empty(value) and f.name not in required:
                continue  # an optional field the writer did not set stays absent, as before
            out[f.name] = _plain(value)
        for k, v in self.extra.items():  # type: ignore[attr-defined]
            out.setdefault(k, v)
        schema.validate(self.KIND, out)
        return out


_NUMBER = ((int, float), (int, float, type(None)))


def _empty(v: Any) -> bool:
    """None, an empty tuple or mapping, or an empty incident part (training.records.parts)."""
    if hasattr(v, "to_json") and not isinstance(v, Record):
        return not v
    return v is None or (isinstance(v, tuple | Mapping) and not v)


def _plain(v: Any) -> Any:
    if isinstance(v, Record) or hasattr(v, "to_json"):
        return v.to_json()
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


def now() -> float:
    return time.time()
