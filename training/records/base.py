"""What every typed record shares: the kind and version stamp, validation on the way in, unknown fields
kept on the way through.

A record class is a frozen dataclass with a `KIND`. `from_json` checks the object against the kind's
required fields (`training.records.schema.validate`, one table for every reader) and the types of the optional
fields the class declares, then builds the instance; a field it does not declare is kept in `extra`, so a
record read and written again loses nothing a newer writer added. `to_json` gives the JSON object back,
stamped with `schema_version` and `kind`: a record read from JSON writes back exactly what it read (an
optional field present as null or empty stays so, an absent one stays absent), and a record built in code
leaves its unset optional fields out. Every error is a `SchemaError` (a ValueError) naming the field.
The readers of one field (`opt_int`, `need`, `stamped`...) are in `training.records.fields`.

The kinds outside the schema table (the segment, the directive, the orchestrator's own kinds) are
`Declared`: every field declared once as a `fields.Field`, from which their `from_json`, `to_json` and
construction-time checks come. The parts of a record are `Part`s.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, Self

from training.records import schema
from training.records.fields import SET, Field, Reader, opt_obj, stamped
from training.records.schema import SchemaError

_STAMP = ("schema_version", "kind")
_OWN = frozenset({"schema_version", "extra", "as_read"})
"""The dataclass fields `to_json` does not write among the declared ones: the version (written in the
stamp), `extra` (written after them) and `as_read` (what it holds is written in its field's place)."""


class RecordType(Protocol):
    """What every record class offers, `Record`'s subclasses and the kinds that are dataclasses of their
    own alike: `from_json` validates (a ValueError naming the field) and builds; `to_json` gives the
    object back as it is stored."""

    @classmethod
    def from_json(cls, obj: Any, /) -> Any: ...

    def to_json(self) -> dict[str, Any]: ...


class Record:
    """Mixin of the record dataclasses: `KIND`, `from_json`, `to_json`, `extra`, `as_read`.

    A class declares its required fields (those of `schema.REQUIRED`, taken as validated and as written:
    a number keeps its type), its optional ones in `OPTIONAL` (field -> reader), and converts the rest in
    `_convert`; besides `schema_version` and `extra` it declares `as_read` (`Mapping[str, Any]`, default
    empty), where `from_json` keeps the optional fields the object held that read as empty.

    Why `as_read`: `to_json` leaves out an optional field whose value is empty (None, an empty tuple,
    mapping or part), which is what the writers that build records in code write. A stored record can
    hold such a field anyway (`"loss": null` for a NaN loss, `"previous_step": null` on a first pointer,
    `"steps": []`), and code that reads a record and writes it again (the promotion history copies the
    pointer's `to_json()`) must not change it: the same contract as `Part`'s `nulls`. `to_json` writes a
    field of `as_read` back, as it was written, while the field's value is still empty; a value set
    since (`dataclasses.replace`) is written as any other."""

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
        for name in schema.REQUIRED[cls.KIND]:
            if name in declared:
                args[name] = obj[name]  # validated; a number as written, as `opt_float` keeps it
        args.update({name: read(cls.KIND, obj, name) for name, read in cls.OPTIONAL.items()})
        args.update(cls._convert(obj))
        args["schema_version"] = obj["schema_version"]
        args["extra"] = {k: v for k, v in obj.items() if k not in declared and k not in _STAMP}
        optional = declared - schema.REQUIRED[cls.KIND].keys() - _OWN
        # A field the class does not read stays at its default, which is empty.
        args["as_read"] = {k: obj[k] for k in optional if k in obj and _empty(args.get(k))}
        return cls(**args)

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the stamp, the declared fields (tuples as lists, nested records as objects),
        then the extra fields. An empty optional field is left out unless the record was read with it
        (`as_read`): then it is written as it was read."""
        out: dict[str, Any] = {"schema_version": self.schema_version, "kind": self.KIND}  # type: ignore[attr-defined]
        required = schema.REQUIRED[self.KIND]
        as_read: Mapping[str, Any] = self.as_read  # type: ignore[attr-defined]
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name in _OWN:
                continue
            value = getattr(self, f.name)
            if _empty(value) and f.name not in required:
                if f.name in as_read:
                    out[f.name] = copy.deepcopy(as_read[f.name])  # the caller may change `out`
                continue
            out[f.name] = _plain(value)
        for k, v in self.extra.items():  # type: ignore[attr-defined]
            out.setdefault(k, v)
        schema.validate(self.KIND, out)
        return out


def _empty(v: Any) -> bool:
    """None, an empty tuple or mapping, or an empty `Part` (one whose JSON is `{}`)."""
    if isinstance(v, Part):
        return not v
    return v is None or (isinstance(v, tuple | Mapping) and not v)


def _plain(v: Any) -> Any:
    if hasattr(v, "to_json"):  # a record, a part, or a nested value that writes its own (job.World)
        return v.to_json()
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


class Part:
    """Mixin of a record's parts (an incident's attribution, drain... in training/records/parts.py) and of
    the small records that travel between tasks (a node's probe, the monitor's event): `READ` maps each
    declared field, in the order the writers write them, to its reader; the frozen dataclass (`parts.PART`)
    adds the fields, `nulls` and `extra`.

    `from_json` reads every declared field with its reader (a SchemaError naming the field), remembers
    which declared fields were null and keeps the undeclared ones in `extra`, so `to_json` gives back the
    object it read: declared fields in `READ`'s order (None left out unless it was read as null; tuples
    as lists, parts as their objects, a field of `WRITE` through its writer), then `extra`. Parts compare
    by their JSON; an empty one (`{}`) is false."""

    __slots__ = ()
    PART: ClassVar[str]
    READ: ClassVar[Mapping[str, Reader]]
    WRITE: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}
    """Declared fields whose value is neither plain JSON nor a part: field -> its JSON."""
    WITHIN: ClassVar[str] = ""
    """The field of the record that holds this part when errors name it (`carry`: `'carry.promoted'`)."""
    ERROR_KIND: ClassVar[str] = ""
    """The record named in errors (the `kind` the readers get); empty: an incident's part (`incident
    <PART>`)."""

    @classmethod
    def error_kind(cls) -> str:
        """`ERROR_KIND`, or the incident's part `PART` by default."""
        return cls.ERROR_KIND or f"incident {cls.PART}"

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        """Read the part from a decoded JSON object; raises SchemaError naming the field."""
        kind = cls.error_kind()
        where = f"{kind} record field {cls.WITHIN!r}" if cls.WITHIN else kind
        if not isinstance(obj, Mapping):
            raise SchemaError(f"{where} = {obj!r:.80} is not a JSON object")
        named = {f"{cls.WITHIN}.{k}": v for k, v in obj.items()} if cls.WITHIN else obj
        prefix = f"{cls.WITHIN}." if cls.WITHIN else ""
        args: dict[str, Any] = {name: read(kind, named, prefix + name) for name, read in cls.READ.items()}
        args["nulls"] = frozenset(k for k in cls.READ if k in obj and obj[k] is None)
        args["extra"] = {k: v for k, v in obj.items() if k not in cls.READ}
        return cls(**args)

    @classmethod
    def shown(cls, obj: Any) -> Self:
        """For a reader that must not fail (a display): `from_json` of `obj` without the declared fields
        that do not read (each left out); something that is no object is the empty part."""
        if not isinstance(obj, Mapping):
            return cls()

        def reads(k: str, v: Any) -> bool:
            try:
                cls.from_json({k: v})
            except SchemaError:
                return False
            return True

        return cls.from_json({k: v for k, v in obj.items() if k not in cls.READ or reads(k, v)})

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
                if name in self.WRITE and v is not None:
                    v = self.WRITE[name](v)
                out[name] = v.to_json() if isinstance(v, Part) else list(v) if isinstance(v, tuple) else v
        for k, v in self.extra.items():  # type: ignore[attr-defined]
            out.setdefault(k, v)
        return out

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_json() == other.to_json()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # equal by value, and extra holds a dict

    def __bool__(self) -> bool:
        return bool(self.to_json())


FIELDS_HERE = "..."
"""In `Declared.ORDER`: the declared fields not named elsewhere in it, in `FIELDS`' order."""
EXTRA_HERE = "*"
"""In `Declared.ORDER`: the fields the reader did not know (`extra`), as read."""


class Declared:
    """Mixin of the record kinds outside `schema.REQUIRED`'s table (the segment, the directive, the
    orchestrator's own kinds): each declares its fields once, in `FIELDS` (attribute -> `Field`: reader,
    checks, JSON name, when written), and gets `from_json`, `to_json` and the checks at construction.

    The frozen dataclass declares the attributes, `schema_version` (default `VERSION`) and, when the
    kind keeps the fields it does not know, `extra`. `from_json` takes JSON text or an object stamped
    with `KIND` and a version 1..`VERSION` (`stamped`), reads every field with its `Field` (a SchemaError
    naming the kind and the field) and builds the record; building it runs each field's checks (in code
    too, so no writer stores what no reader accepts), then `_settle`. `to_json` writes the keys in
    `ORDER` (the stamp, `FIELDS_HERE`, `EXTRA_HERE`, or an attribute named on its own), tuples as lists,
    then `CONSTANT`.

    Why `ORDER` and `CONSTANT`: each kind keeps the JSON its writers wrote before it was declared
    (the corpus in tests/fixtures/records/ holds those bytes), key order included."""

    __slots__ = ()
    KIND: ClassVar[str]
    VERSION: ClassVar[int] = 1
    FIELDS: ClassVar[Mapping[str, Field]]
    ORDER: ClassVar[tuple[str, ...]] = ("schema_version", "kind", FIELDS_HERE, EXTRA_HERE)
    CONSTANT: ClassVar[Mapping[str, Any]] = {}
    """Written after the rest, never read back (a security event's runbook)."""
    schema_version: int

    def __post_init__(self) -> None:
        for name, spec in self.FIELDS.items():
            v = getattr(self, name)
            if v is None and not spec.need:
                continue
            for check in spec.checks:
                if (why := check(v)) is not None:
                    raise SchemaError(f"{self.KIND} record field {spec.key or name!r} = {v!r:.80}: {why}")
        v = self.schema_version
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= self.VERSION:
            raise SchemaError(
                f"{self.KIND} record field 'schema_version' = {v!r}; this reader knows 1..{self.VERSION}"
            )
        self._settle()

    def _settle(self) -> None:
        """The kind's checks across fields and its conversions (a list to a tuple), after each field's."""

    @classmethod
    def _keeps_extra(cls) -> bool:
        return any(f.name == "extra" for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, raw: Any) -> Self:
        """The record in JSON text or a decoded object; a SchemaError (a ValueError) naming the field."""
        obj = stamped(cls.KIND, raw, cls.VERSION)
        args: dict[str, Any] = {name: spec.take(cls.KIND, obj, name) for name, spec in cls.FIELDS.items()}
        args["schema_version"] = obj["schema_version"]
        if cls._keeps_extra():
            known = {spec.key or name for name, spec in cls.FIELDS.items()}.union(_STAMP)
            args["extra"] = {k: v for k, v in obj.items() if k not in known}
        return cls(**args)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        alone = set(self.ORDER) - {*_STAMP, FIELDS_HERE, EXTRA_HERE}  # attributes placed on their own
        for place in self.ORDER:
            if place == "schema_version":
                out[place] = self.schema_version
            elif place == "kind":
                out[place] = self.KIND
            elif place == EXTRA_HERE:
                out.update(getattr(self, "extra", {}))
            elif place == FIELDS_HERE:
                for name in self.FIELDS:
                    if name not in alone:
                        self._write(out, name)
            else:
                self._write(out, place)
        out.update(self.CONSTANT)
        return out

    def _write(self, out: dict[str, Any], name: str) -> None:
        spec = self.FIELDS[name]
        when = name if spec.when == SET else spec.when
        if when and getattr(self, when) is None:
            return
        v = getattr(self, name)
        out[spec.key or name] = dict(v) if isinstance(v, Mapping) else _plain(v)


def now() -> float:
    return time.time()
