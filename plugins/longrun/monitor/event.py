"""The monitor's trigger event: `RunMonitorTrigger` writes it, the operator reads it, one type for both.

The trigger fires with a plain object: one `watch` event (`watch.look`'s fields, or an error) plus what
every event carries (`seen`, `carry`, `at`). The trigger builds it as a `MonitorEvent` and sends its
`to_json`; `MonitorEvent.from_json` checks it where the operator receives it and gives attributes.
`Carry` is what the operator keeps across deferrals: the gate's result for every checkpoint it promoted
or rejected. Both are parts in the records' sense (training/records/base.py `Part`): a wrong type is
refused naming the field, undeclared fields and nulls come back as read, in the order read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from longrun.monitor import watch
from training.records.base import Part
from training.records.fields import (
    SET,
    Field,
    need,
    opt_bool,
    opt_dict,
    opt_float,
    opt_int,
    opt_obj,
    opt_objects,
    opt_str,
    while_set,
)
from training.records.schema import SchemaError

KIND = "monitor_event"


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)  # base.PART, spelled out for mypy
class Carry(Part):
    """Gate results of this watch so far, carried from one deferral to the next."""

    promoted: tuple[dict[str, Any], ...] = ()
    rejected: tuple[dict[str, Any], ...] = ()

    FIELDS = while_set(promoted=opt_objects, rejected=opt_objects)
    WITHIN = "carry"
    ERROR_KIND = KIND

    def add(self, result: Mapping[str, Any]) -> Carry:
        """With the gate's `result` for one more checkpoint (`gate.gate_checkpoint`'s dict)."""
        if result.get("promoted"):
            return replace(self, promoted=(*self.promoted, dict(result)))
        return replace(self, rejected=(*self.rejected, dict(result)))


#: The fields an event of a type cannot do without.
_NEEDS = {watch.CHECKPOINT: ("step",), watch.ALERT: ("alert_key", "alert")}


def _type(kind: str, obj: Mapping[str, Any], name: str) -> str:
    """The event's type, and the fields that type needs present."""
    typ = str(need(kind, obj, name, opt_str))
    for needed in _NEEDS.get(typ, ()):
        need(kind, obj, needed, lambda *_: None)
    return typ


def _seen(kind: str, obj: Mapping[str, Any], name: str) -> watch.Seen:
    d = need(kind, obj, name, opt_dict)
    try:
        return watch.seen_from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise SchemaError(f"{kind} record field {name!r} = {d!r:.80}: {e}") from None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)  # base.PART, spelled out for mypy
class MonitorEvent(Part):
    """One trigger event. Which fields are set depends on `type` (see `longrun.monitor.watch`)."""

    type: str
    """`alert`, `checkpoint`, `job_done`, `launch_held`, `stale`, `no_records` or `error`."""
    alert_key: str | None = None
    alert: dict[str, Any] | None = None
    """The alert record as the job wrote it (checked by `alert_auth` before it is read as an Alert)."""
    step: int | None = None
    manifest_key: str | None = None
    outcome: str | None = None
    label: str | None = None
    age_s: float | None = None
    """A stale event's: seconds since the last progress."""
    progress: dict[str, Any] | None = None
    """A stale event's: the last progress record (null: none yet)."""
    retryable: bool | None = None
    message: str | None = None
    state: dict[str, Any] | None = None
    """Slurm's state of the ended (or launch-held) job (`JobState.to_dict`)."""
    seen: watch.Seen
    """What the monitor has handled."""
    carry: Carry = field(default_factory=Carry)
    at: float | None = None
    """Epoch seconds the trigger fired."""

    # In the order the trigger has always written them: each type's fields, then seen, carry, at.
    FIELDS = while_set(
        type=_type,
        alert_key=opt_str,
        alert=opt_obj,
        step=opt_int,
        manifest_key=opt_str,
        outcome=opt_str,
        label=opt_str,
        age_s=opt_float,
        progress=opt_obj,
        retryable=opt_bool,
        message=opt_str,
        state=opt_obj,
        seen=Field(_seen, need=False, when=SET, write=watch.seen_to_dict),
        carry=Carry.read_or_empty,
        at=opt_float,
    )
    ERROR_KIND = KIND
