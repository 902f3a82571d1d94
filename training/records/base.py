"""The one record idiom: a frozen dataclass that declares each of its fields once, in `FIELDS` (attribute
-> `fields.Field`: reader, checks, JSON name, when written), and gets `from_json`, `to_json` and the
checks at construction from `Declared`. Every error is a `SchemaError` (a ValueError) naming the field.
The readers of one field (`opt_int`, `need`, `stamped`...) are in `training.records.fields`.

Three kinds of classes use it, each with a thin base of its own that sets how the object is opened and
stamped: the kinds of `schema.REQUIRED`'s table (`Record`: validated against the table, which holds
their required fields' types), the parts of a record and the small records that travel between tasks
(`Part`: no stamp, lenient readers for a display), and the other kinds (`Declared` itself: the segment,
the directive, the orchestrator's own kinds). A field the reader does not know is kept in `extra`, and a
field read as empty is kept in `as_read`, where the class declares them, so a record read and written
again loses nothing and changes nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, Self

from training.records import schema
from training.records.fields import FILLED, SET, Field, opt_obj, stamped
from training.records.schema import SchemaError

_STAMP = ("schema_version", "kind")


class RecordType(Protocol):
    """What every record class offers: `from_json` validates (a ValueError naming the field) and builds;
    `to_json` gives the object back as it is stored."""

    @classmethod
    def from_json(cls, obj: Any, /) -> Any: ...

    def to_json(self) -> dict[str, Any]: ...


FIELDS_HERE = "..."
"""In `Declared.ORDER`: the declared fields not named elsewhere in it, in `FIELDS`' order."""
EXTRA_HERE = "*"
"""In `Declared.ORDER`: the fields the reader did not know (`extra`), as read."""


class Declared:
    """Mixin of every record class: each declares its fields once, in `FIELDS` (attribute -> `Field`:
    reader, checks, JSON name, when written), and gets `from_json`, `to_json` and the checks at
    construction.

    The frozen dataclass declares the attributes, `schema_version` (default `VERSION`) when the kind is
    stamped, and, when the kind keeps them, `extra` (the fields it does not know) and `as_read` (the
    fields it read whose value is not written: a null or empty value, written back as read while the
    value stays empty). `from_json` opens the JSON text or object (`_open`: by default stamped with
    `KIND` and a version 1..`VERSION`), reads every field with its `Field` (a SchemaError naming the
    kind and the field) and builds the record; building it runs each field's checks (in code too, so no
    writer stores what no reader accepts), then `_settle`. `to_json` writes the keys in `ORDER` (the
    stamp, `FIELDS_HERE`, `EXTRA_HERE`, or an attribute named on its own; tuples as lists, records and
    parts as their objects), then `CONSTANT`. `WITHIN` names the record's field that holds a part, for
    its errors (`carry`: `'carry.promoted'`).

    Why `ORDER` and `CONSTANT`: each kind keeps the JSON its writers wrote before it was declared
    (the corpus in tests/fixtures/records/ holds those bytes), key order included."""

    __slots__ = ()
    KIND: ClassVar[str]
    VERSION: ClassVar[int] = 1
    FIELDS: ClassVar[Mapping[str, Field]]
    ORDER: ClassVar[tuple[str, ...]] = ("schema_version", "kind", FIELDS_HERE, EXTRA_HERE)
    CONSTANT: ClassVar[Mapping[str, Any]] = {}
    """Written after the rest, never read back (a security event's runbook)."""
    WITHIN: ClassVar[str] = ""
    schema_version: int

    def __post_init__(self) -> None:
        for name, spec in self.FIELDS.items():
            if spec.checks and ((v := getattr(self, name)) is not None or spec.need):
                for check in spec.checks:
                    if (why := check(v)) is not None:
                        raise SchemaError(
                            f"{self.error_kind()} record field {spec.key or name!r} = {v!r:.80}: {why}"
                        )
        v = getattr(self, "schema_version", 1)  # an unstamped part has none
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= self.VERSION:
            raise SchemaError(
                f"{self.KIND} record field 'schema_version' = {v!r}; this reader knows 1..{self.VERSION}"
            )
        self._settle()

    def _settle(self) -> None:
        """The kind's checks across fields and its conversions (a list to a tuple), after each field's."""

    @classmethod
    def error_kind(cls) -> str:
        """The record named in errors."""
        return cls.KIND

    @classmethod
    def _open(cls, raw: Any) -> Mapping[str, Any]:
        """The object of JSON text or a decoded object, its stamp checked."""
        return stamped(cls.KIND, raw, cls.VERSION)

    @classmethod
    def from_json(cls, raw: Any) -> Self:
        """The record in JSON text or a decoded object; a SchemaError (a ValueError) naming the field."""
        obj, kind, (keys, stamp, known, _) = cls._open(raw), cls.error_kind(), _layout(cls)
        within = f"{cls.WITHIN}." if cls.WITHIN else ""
        named = {within + k: v for k, v in obj.items()} if within else obj
        args = {name: spec.take(kind, named, within + key) for name, key, spec in keys}
        if "schema_version" in stamp:
            args["schema_version"] = obj["schema_version"]
        if "extra" in cls.__dataclass_fields__:  # type: ignore[attr-defined]
            args["extra"] = {k: v for k, v in obj.items() if k not in known}
        if "as_read" in cls.__dataclass_fields__:  # type: ignore[attr-defined]
            args["as_read"] = {k: obj[k] for n, k, s in keys if k in obj and _skipped(s.when, args[n])}
        return cls(**args)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        alone = _layout(type(self))[3]
        for place in self.ORDER:
            if place == "schema_version":
                out[place] = self.schema_version
            elif place == "kind":
                out[place] = self.KIND
            elif place == EXTRA_HERE:
                for k, v in getattr(self, "extra", {}).items():
                    out.setdefault(k, v)
            elif place == FIELDS_HERE:
                for name in self.FIELDS:
                    if name not in alone:
                        self._write(out, name)
            else:
                self._write(out, place)
        out.update(self.CONSTANT)
        return out

    def _write(self, out: dict[str, Any], name: str) -> None:
        spec, v = self.FIELDS[name], getattr(self, name)
        key, when = spec.key or name, spec.when
        if when in (SET, FILLED):
            if _skipped(when, v):
                if key in (as_read := getattr(self, "as_read", {})):
                    out[key] = copy.deepcopy(as_read[key])  # as it was read; the caller may change `out`
                return
        elif when and getattr(self, when) is None:
            return
        out[key] = spec.write(v) if spec.write else _plain(v)


_Layout = tuple[tuple[tuple[str, str, Field], ...], set[str], set[str], set[str]]
_LAYOUTS: dict[type[Declared], _Layout] = {}


def _layout(cls: type[Declared]) -> _Layout:
    """Of a record class, worked out once: each field's attribute, JSON name and `Field`; the stamp keys
    it writes; the keys it knows (its fields' and the stamp); the attributes its `ORDER` places alone."""
    if (got := _LAYOUTS.get(cls)) is None:
        keys = tuple((name, spec.key or name, spec) for name, spec in cls.FIELDS.items())
        stamp = {k for k in _STAMP if k in cls.ORDER}
        alone = set(cls.ORDER) - {*_STAMP, FIELDS_HERE, EXTRA_HERE}
        got = _LAYOUTS[cls] = keys, stamp, {key for _, key, _ in keys} | stamp, alone
    return got


def _skipped(when: str, v: Any) -> bool:
    """Whether a field written `when` is left out with the value `v`: SET, while None; FILLED, while
    empty."""
    return v is None if when == SET else when == FILLED and _empty(v)


def _empty(v: Any) -> bool:
    """None, an empty tuple or mapping, or an empty `Part` (one whose JSON is `{}`)."""
    if v is None:
        return True
    return not isinstance(v, str | int | float) and isinstance(v, tuple | Mapping | Part) and not v


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, str | int | float):
        return v
    if hasattr(v, "to_json"):  # a record, a part, or a nested value that writes its own (job.World)
        return v.to_json()
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return dict(v) if isinstance(v, Mapping) else v


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Record(Declared):
    """Base of the kinds of `schema.REQUIRED`'s table (`fields.schema_fields` declares their fields):
    `from_json` validates the object against the table (the required fields and their types) before it
    reads the fields, and `to_json` validates what it writes. An optional field is written while not
    empty, or as it was read (`as_read`: `"loss": null` for a NaN loss, `"steps": []`): code that reads
    a record and writes it again (the promotion history copies the pointer's `to_json()`) changes
    nothing."""

    VERSION = schema.SCHEMA_VERSION
    schema_version: int = schema.SCHEMA_VERSION
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    as_read: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def _open(cls, raw: Any) -> Mapping[str, Any]:
        schema.validate(cls.KIND, raw)
        if raw.get("kind", cls.KIND) != cls.KIND:
            raise SchemaError(f"{cls.KIND} record field 'kind' = {raw.get('kind')!r}; expected {cls.KIND!r}")
        return raw

    def to_json(self) -> dict[str, Any]:
        out = Declared.to_json(self)
        schema.validate(self.KIND, out)
        return out


PART = dataclasses.dataclass(frozen=True, slots=True, kw_only=True, eq=False)
"""The dataclass decorator of a part (eq=False: parts compare by their JSON, `Part.__eq__`)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True, eq=False)  # PART, spelled out for mypy
class Part(Declared):
    """Base of a record's parts (an incident's attribution, drain... in training/records/incident.py and
    diagnosis.py) and of the small records that travel between tasks (a node's probe, the monitor's
    event): no stamp; every field read with its reader and written while set (`fields.while_set`), a
    null kept as read. `ERROR_KIND` is the record named in errors (empty: an incident's part,
    `incident <PART>`). Parts compare by their JSON; an empty one (`{}`) is false."""

    PART: ClassVar[str]
    ERROR_KIND: ClassVar[str] = ""
    ORDER = (FIELDS_HERE, EXTRA_HERE)
    as_read: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def error_kind(cls) -> str:
        """`ERROR_KIND`, or the incident's part `PART` by default."""
        return cls.ERROR_KIND or f"incident {cls.PART}"

    @classmethod
    def _open(cls, raw: Any) -> Mapping[str, Any]:
        if not isinstance(raw, Mapping):
            kind = cls.error_kind()
            where = f"{kind} record field {cls.WITHIN!r}" if cls.WITHIN else kind
            raise SchemaError(f"{where} = {raw!r:.80} is not a JSON object")
        return raw

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

        return cls.from_json({k: v for k, v in obj.items() if k not in cls.FIELDS or reads(k, v)})

    @classmethod
    def read(cls, kind: str, obj: Mapping[str, Any], name: str) -> Self | None:
        """A `Reader` of the part as a field of `obj` (absent or null: None)."""
        v = opt_obj(kind, obj, name)
        return None if v is None else cls.from_json(v)

    @classmethod
    def read_or_empty(cls, kind: str, obj: Mapping[str, Any], name: str) -> Self:
        """A `Reader` of the part as a field of `obj` (absent or null: the empty part)."""
        return cls.read(kind, obj, name) or cls()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_json() == other.to_json()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # equal by value, and extra holds a dict

    def __bool__(self) -> bool:  # to_json() != {}
        written = (not _skipped(s.when, getattr(self, n)) for n, s in self.FIELDS.items())
        return bool(self.extra or self.as_read) or any(written)


def now() -> float:
    return time.time()
