"""The trigger writes its event with `MonitorEvent` (the type the operator reads it with): the payload
is, byte for byte and key order included, the plain dict it built before, `{**look's event, "seen",
"carry", "at"}`, for every event `watch.look` returns and every error the trigger sends. Pure Python: the
events are given in the shapes `watch.look` builds (a look needs a Slurm job); no Airflow database."""

from __future__ import annotations

import json
from typing import Any

import pytest
from longrun.monitor import watch
from longrun.monitor.event import Carry, MonitorEvent
from longrun.monitor.trigger import RunMonitorTrigger

#: As the operator defers: a Seen it built (stale_after_s as the DAG gave it, an int here) and its Carry.
SEEN = watch.seen_to_dict(
    watch.Seen(run="r1", job_id=42, steps=(10,), alerts=("a",), stale_after_s=600, since=1767225600.5)
)
CARRY = Carry().add({"step": 10, "validated": True, "promoted": True}).add({"step": 15, "validated": False})

#: What `watch.look` returns, one of each type (a stale job without progress yet has progress null).
LOOKS: list[dict[str, Any]] = [
    {"type": watch.ALERT, "alert_key": "runs/r1/alerts/x.json", "alert": {"kind": "alert", "step": 40}},
    {"type": watch.CHECKPOINT, "step": 20, "manifest_key": "runs/r1/checkpoints/step-00000020/manifest.json"},
    {
        "type": watch.JOB_DONE,
        "outcome": "failed",
        "label": None,
        "message": "FAILED (exit 1)",
        "state": {"job_id": 42, "status": "FAILED", "exit_code": 1},
    },
    {"type": watch.STALE, "age_s": 700.1, "progress": {"step": 30, "time": 5.0}, "message": "no progress"},
    {"type": watch.STALE, "age_s": 612.0, "progress": None, "message": "no progress yet"},
    {
        "type": watch.LAUNCH_HELD,
        "message": "Slurm holds job 42 after a failed launch",
        "state": {"job_id": 42, "status": "requeued", "reason": "launch_failed_requeued_held"},
    },
    {"type": watch.ERROR, "retryable": True, "message": "30 failed looks: timeout"},
    {"type": watch.ERROR, "retryable": False, "message": "KeyError: 'x'"},
]


@pytest.mark.parametrize("look", LOOKS, ids=lambda e: f"{e['type']}-{e.get('retryable', e.get('age_s', ''))}")
def test_the_payload_is_the_one_the_trigger_built_as_a_plain_dict(look: dict[str, Any]) -> None:
    trigger = RunMonitorTrigger(seen=SEEN, carry=CARRY.to_json())
    payload = trigger._event(**look).payload
    before = {**look, "seen": SEEN, "carry": CARRY.to_json(), "at": payload["at"]}
    assert json.dumps(payload) == json.dumps(before)
    assert isinstance(payload["at"], float)
    assert MonitorEvent.from_json(json.loads(json.dumps(payload))).to_json() == payload


def test_a_field_the_event_does_not_declare_is_sent_after_the_declared_ones() -> None:
    trigger = RunMonitorTrigger(seen=SEEN, carry=CARRY.to_json())
    payload = trigger._event(type=watch.STALE, message="m", hint="x").payload
    assert list(payload) == ["type", "message", "seen", "carry", "at", "hint"]
    assert MonitorEvent.from_json(payload).extra == {"hint": "x"}


def test_a_malformed_seen_or_carry_is_refused_where_the_operator_defers() -> None:
    with pytest.raises(KeyError):
        RunMonitorTrigger(seen={"job_id": 3})
    with pytest.raises(ValueError, match="'carry.promoted'"):
        RunMonitorTrigger(seen=SEEN, carry={"promoted": [1]})
