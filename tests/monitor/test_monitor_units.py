"""The monitor's pure parts: what it carries across deferrals, and the trigger's serialized kwargs.
(Its looks at a real job are exercised end to end in tests/e2e/test_drill.py.)"""

from __future__ import annotations

import pytest
from longrun.monitor import watch
from longrun.monitor.trigger import RunMonitorTrigger

from training import schema
from training.store import LocalDirStore, put_json


def test_seen_round_trip_and_handled():
    seen = watch.Seen(run="r1", job_id=7, steps=(10,), alerts=("a",), stale_after_s=60, since=1.0)
    assert watch.seen_from_dict(watch.seen_to_dict(seen)) == seen
    after = watch.handled(seen, {"type": watch.CHECKPOINT, "step": 20})
    assert after.steps == (10, 20)
    after = watch.handled(after, {"type": watch.ALERT, "alert_key": "b"})
    assert after.alerts == ("a", "b")


@pytest.mark.parametrize("null", [False, True])
def test_seen_from_a_dict_without_the_optional_fields_takes_seens_own_defaults(null):
    d = {"run": "r1", "job_id": 7}
    if null:  # numbers written as null read as absent
        d |= {"stale_after_s": None, "since": None}
    assert watch.seen_from_dict(d) == watch.Seen(run="r1", job_id=7)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"job_id": 0}, "job_id=0"),
        ({"job_id": True}, "job_id=True"),
        ({"stale_after_s": 0}, "stale_after_s=0"),
    ],
)
def test_seen_validation_names_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        watch.Seen(**{"run": "r1", "job_id": 1, **kw})


def test_trigger_serializes_plain_values():
    t = RunMonitorTrigger(seen={"run": "r1", "job_id": 3}, carry={"x": [1]}, slurm_conf="/etc/slurm.conf")
    path, kwargs = t.serialize()
    assert path == "longrun.monitor.trigger.RunMonitorTrigger"
    assert kwargs == {
        "seen": {"run": "r1", "job_id": 3},
        "carry": {"x": [1]},
        "slurm_conf": "/etc/slurm.conf",
        "backend": "cli",
        "poll_s": 1.0,
        "max_poll_s": 10.0,
        "max_errors": 30,
        "settle_s": 15.0,
    }
    assert RunMonitorTrigger(**kwargs).serialize() == (path, kwargs)


def test_store_listings(tmp_path):
    store = LocalDirStore(tmp_path)
    put_json(store, schema.store_key("r1", schema.manifest_path(10)), {"x": 1})
    put_json(store, schema.store_key("r1", "checkpoints/step-00000010/model.pt"), {"x": 1})
    put_json(store, schema.store_key("r1", schema.alert_path(12, "finite", "r000-1")), {"x": 1})
    put_json(store, schema.store_key("r1", schema.PROGRESS_PATH), {"step": 12, "time": 5.0})
    assert watch.manifest_steps(store, "r1") == {10: "runs/r1/checkpoints/step-00000010/manifest.json"}
    assert watch.alert_keys(store, "r1") == ["runs/r1/alerts/00000012-finite-r000-1.json"]
    assert watch.progress(store, "r1") == {"step": 12, "time": 5.0}
    assert watch.progress(store, "nope") is None
