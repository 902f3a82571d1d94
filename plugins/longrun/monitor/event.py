"""The monitor's trigger event, read once where the operator receives it.

`RunMonitorTrigger` fires with a plain object: one `watch` event (`watch.look`'s dict, or an error) plus
what every event carries (`seen`, `carry`, `at`). `MonitorEvent.from_json` checks it and gives the
operator attributes; `to_json` gives the same object back. `Carry` is what the operator keeps across
deferrals: the gate's result for every checkpoint it promoted or rejected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Self

from longrun.monitor import watch
from training.records.base import need, opt_bool, opt_dict, opt_float, opt_int, opt_objects, opt_str
from training.schema import SchemaError

KIND = "monitor_event"


@dataclass(frozen=True, slots=True, kw_only=True)
class Carry:
    """Gate results of this watch so far, carried from one deferral to the next."""

    promoted: tuple[dict[str, Any], ...] = ()
    rejected: tuple[dict[str, Any], ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        if not isinstance(obj, Mapping):
            raise SchemaError(f"{KIND} record field 'carry' = {obj!r:.80} is not an object")
        named = {f"carry.{k}": v for k, v in obj.items()}  # errors name the field within the event
        return cls(
            promoted=opt_objects(KIND, named, "carry.promoted"),
            rejected=opt_objects(KIND, named, "carry.rejected"),
            extra={k: v for k, v in obj.items() if k not in ("promoted", "rejected")},
        )

    def to_json(self) -> dict[str, Any]:
        return {"promoted": list(self.promoted), "rejected": list(self.rejected), **self.extra}

    def add(self, result: Mapping[str, Any]) -> Carry:
        """With the gate's `result` for one more checkpoint (`gate.gate_checkpoint`'s dict)."""
        if result.get("promoted"):
            return replace(self, promoted=(*self.promoted, dict(result)))
        return replace(self, rejected=(*self.rejected, dict(result)))


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitorEvent:
    """One trigger event. Which fields are set depends on `type` (see `longrun.monitor.watch`)."""

    type: str
    """`alert`, `checkpoint`, `job_done`, `stale` or `error`."""
    seen: watch.Seen
    """What the monitor has handled."""
    carry: Carry = Carry()
    at: float | None = None
    """Epoch seconds the trigger fired."""
    step: int | None = None
    manifest_key: str | None = None
    alert_key: str | None = None
    alert: dict[str, Any] | None = None
    """The alert record as the job wrote it (checked by `alert_auth` before it is read as an Alert)."""
    outcome: str | None = None
    label: str | None = None
    state: dict[str, Any] | None = None
    """Slurm's state of the ended job (`JobState.to_dict`)."""
    message: str | None = None
    retryable: bool | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Fields this reader does not declare (`age_s`, `progress` of a stale event...), kept as sent."""

    _OBJECTS = ("alert", "state")
    _SCALARS = {
        "at": opt_float,
        "step": opt_int,
        "manifest_key": opt_str,
        "alert_key": opt_str,
        "outcome": opt_str,
        "label": opt_str,
        "message": opt_str,
        "retryable": opt_bool,
    }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        if not isinstance(obj, Mapping):
            raise SchemaError(f"{KIND} record must be a JSON object, got {type(obj).__name__}")
        args: dict[str, Any] = {name: read(KIND, obj, name) for name, read in cls._SCALARS.items()}
        for name in cls._OBJECTS:
            args[name] = opt_dict(KIND, obj, name) if obj.get(name) is not None else None
        kind = need(KIND, obj, "type", opt_str)
        for name in _NEEDS.get(kind, ()):
            need(KIND, obj, name, lambda *_: None)
        known = {"type", "seen", "carry", *cls._SCALARS, *cls._OBJECTS}
        return cls(
            type=kind,
            seen=_seen(need(KIND, obj, "seen", opt_dict)),
            carry=Carry.from_json(obj.get("carry") or {}),
            extra={k: v for k, v in obj.items() if k not in known},
            **args,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        for name in (*self._SCALARS, *self._OBJECTS):
            if (v := getattr(self, name)) is not None:
                out[name] = v
        out.update(self.extra)
        out.update(seen=watch.seen_to_dict(self.seen), carry=self.carry.to_json())
        return out


#: The fields an event of a type cannot do without.
_NEEDS = {watch.CHECKPOINT: ("step",), watch.ALERT: ("alert_key", "alert")}


def _seen(obj: dict[str, Any]) -> watch.Seen:
    try:
        return watch.seen_from_dict(obj)
    except (KeyError, TypeError, ValueError) as e:
        raise SchemaError(f"{KIND} record field 'seen' = {obj!r:.80}: {e}") from None
