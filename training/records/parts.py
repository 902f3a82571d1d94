"""What the parts of an incident record share. The parts (the attribution, the drain, the diagnosis, the
restart checkpoint, the relaunch: training/records/incident.py and diagnosis.py) are also what
sdc_incident's steps return through XCom. Field meanings are in docs/contracts.md and the steps' modules.

A part is read once where it crosses a boundary (the record from the store, a step's result from XCom):
`from_json` checks the type of every field the part declares and refuses a wrong one with a SchemaError
that names the part and the field; a field it does not declare stays in `extra`, and a declared field
the writer set to null is remembered, so `to_json` gives back the object it read. Every field is
optional: a record written by older code may lack any of them, and an absent part is the empty one
(false, `to_json() == {}`).

Readers use the attributes. Two parts are equal when their JSON is; an empty part is false. The mixin,
`Part`, lives in training/records/base.py (a record's `to_json` leaves an empty part out); this module
holds the decorator and the readers the incident's parts share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from training.records.fields import ints, opt_int


def opt_ints(kind: str, obj: Mapping[str, Any], name: str) -> tuple[int, ...] | None:
    v = obj.get(name)
    return None if v is None else ints(kind, name, v)


def opt_job_id(kind: str, obj: Mapping[str, Any], name: str) -> int | str | None:
    """A Slurm job id: an integer, or its text."""
    v = obj.get(name)
    if v is None or isinstance(v, str):
        return v
    return opt_int(kind, obj, name)


PART = dataclass(frozen=True, slots=True, kw_only=True, eq=False)
"""The dataclass decorator of a part (eq=False: parts compare by their JSON, Part.__eq__)."""


__all__ = ["PART", "opt_ints", "opt_job_id"]
