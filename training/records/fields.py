"""Readers of one record field: each checks the type and raises a SchemaError naming the field, or reads
the version stamp of a record (`stamped`, `versioned`); and `Field`, the declaration of one field of a
record kind (`training.records.base.Declared`: its reader, checks, JSON name), with the checks those
kinds share (`run_name`, `non_empty`, `epoch_seconds`...) and the tables of a part's fields
(`while_set`) and of a kind of `schema.REQUIRED` (`schema_fields`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from training.records.schema import REQUIRED, SchemaError, check_run_name


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
    """An optional number field (absent or null: None), kept as written: an integer stays an int, so a
    record read and written again gives the same JSON (3 stays 3, not 3.0). True and false are refused."""
    v = obj.get(field)
    if v is None:
        return None
    if not _is_number(v):
        raise SchemaError(f"{kind} record field {field!r} = {v!r:.80} is not a number")
    n: float = v  # int or float, as written (an int is a float to the type checker)
    return n


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


def opt_obj(kind: str, obj: Mapping[str, Any], field: str) -> dict[str, Any] | None:
    """An optional object field kept as it is (absent or null: None)."""
    v = obj.get(field)
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise SchemaError(f"{kind} record field {field!r} = {v!r:.80} is not an object")
    return dict(v)


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


def opt_ints(kind: str, obj: Mapping[str, Any], field: str) -> tuple[int, ...] | None:
    """An optional list-of-integers field (absent or null: None)."""
    v = obj.get(field)
    return None if v is None else ints(kind, field, v)


def opt_job_id(kind: str, obj: Mapping[str, Any], field: str) -> int | str | None:
    """A Slurm job id: an integer, or its text."""
    v = obj.get(field)
    return v if v is None or isinstance(v, str) else opt_int(kind, obj, field)


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


# ---- declared fields: how a record kind reads, checks and writes each of its fields ---------------

Check = Callable[[Any], str | None]
"""Checks one field's value: None when it is good, else what is wrong (`must be epoch seconds`)."""

SET = "<set>"
"""`Field.when` of a field written only while it is set (not None)."""
FILLED = "<filled>"
"""`Field.when` of a field written only while it is not empty (None, an empty tuple or mapping, an empty
part)."""


@dataclass(frozen=True, slots=True)
class Field:
    """One declared field of a record kind (`training.records.base.Declared`): its reader, whether the
    record must carry it, its checks, its JSON name and when it is written. Declared once, so each
    kind's `from_json`, `to_json` and construction-time checks come from the same line.

    `need`: absent or null is refused (`need`); else absent or null reads as the reader's empty value.
    `present`: the JSON object must hold the name even when its value is null (a field always written).
    `checks` run on the value whenever the record is built (in code or by `from_json`), skipped for None
    when the field is not needed. `key`: the JSON name when it is not the attribute's. `when`: "" is
    always written; `SET`, only while not None; `FILLED`, only while not empty; an attribute's name, only
    while that one is not None (a `SET` or `FILLED` field read as empty is written back as read, where
    the record keeps `as_read`). `write`: the field's JSON, when it is not plain."""

    read: Reader
    need: bool = True
    present: bool = False
    checks: tuple[Check, ...] = ()
    key: str = ""
    when: str = ""
    write: Callable[[Any], Any] | None = None

    def take(self, kind: str, obj: Mapping[str, Any], key: str) -> Any:
        """The value of this field (JSON name `key`) in the record object `obj`; SchemaError naming it."""
        if self.present and key not in obj:
            raise SchemaError(f"{kind} record lacks field {key!r}")
        return need(kind, obj, key, self.read) if self.need else self.read(kind, obj, key)


def run_name(v: Any) -> str | None:
    """A run name `schema.check_run_name` accepts."""
    try:
        check_run_name(v)
    except SchemaError as e:
        return str(e)
    return None


def non_empty(v: Any) -> str | None:
    return None if isinstance(v, str) and v else "must be a non-empty string"


def epoch_seconds(v: Any) -> str | None:
    return None if _is_number(v) else "must be epoch seconds"


def not_negative(v: Any) -> str | None:
    return None if _is_number(v) and v >= 0 else "must be >= 0"


def slurm_job_id(v: Any) -> str | None:
    """A Slurm job id, as an integer."""
    return None if isinstance(v, int) and not isinstance(v, bool) else "must be a Slurm job id or null"


def an_object(v: Any) -> str | None:
    return None if isinstance(v, Mapping) else "must be an object"


def at_least(low: int) -> Check:
    """An integer >= `low`."""

    def check(v: Any) -> str | None:
        good = isinstance(v, int) and not isinstance(v, bool) and v >= low
        return None if good else f"must be an integer >= {low}"

    return check


def one_of(values: tuple[str, ...]) -> Check:
    return lambda v: None if v in values else f"not one of {values}"


def matches(pattern: re.Pattern[str], what: str) -> Check:
    """A string `pattern` matches (anchor it: `^...$`); `what` says what is wrong otherwise."""
    return lambda v: None if isinstance(v, str) and pattern.match(v) else what


def while_set(**readers: Reader | Field) -> dict[str, Field]:
    """The fields of a part: each optional, read with its reader and written while set (not None), or
    declared whole (a `Field`)."""
    return {n: r if isinstance(r, Field) else Field(r, need=False, when=SET) for n, r in readers.items()}


def as_written(kind: str, obj: Mapping[str, Any], field: str) -> Any:
    """A field taken as written (a required field of `schema.REQUIRED`'s table, validated before)."""
    return obj.get(field)


def ints_of(kind: str, obj: Mapping[str, Any], field: str) -> tuple[int, ...]:
    """A list-of-integers field as a tuple (absent or null: empty)."""
    return ints(kind, field, obj.get(field) or ())


def strs_of(kind: str, obj: Mapping[str, Any], field: str) -> tuple[str, ...]:
    """A list-of-strings field as a tuple (absent or null: empty)."""
    return strs(kind, field, obj.get(field) or ())


def schema_fields(kind: str, **readers: Reader) -> dict[str, Field]:
    """The fields of a kind of `schema.REQUIRED`'s table (a `base.Record`): its required fields, taken as
    validated (a number as written) unless `readers` names one, always written; then the other fields of
    `readers`, optional, written while not empty (`FILLED`)."""
    required = REQUIRED[kind]
    out = {name: Field(readers.get(name, as_written), need=False) for name in required}
    return out | {n: Field(r, need=False, when=FILLED) for n, r in readers.items() if n not in required}
