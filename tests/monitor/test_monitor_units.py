"""The monitor's pure parts: what it carries across deferrals, and the trigger's serialized kwargs.
(Its looks at a real job are exercised end to end in tests/e2e/test_drill.py.)"""

from __future__ import annotations

import pytest
from longrun.monitor import watch
from longrun.monitor.trigger import RunMonitorTrigger
from longrun.slurm.models import JobState, JobStatus

from training.records import schema
from training.store.interface import put_json
from training.store.local import LocalDirStore


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


# ---- an entrypoint that never writes a record -----------------------------------------------------------


class _OneJob:
    """A SlurmClient that knows one job, in one state."""

    def __init__(self, state: JobState) -> None:
        self.state = state

    def job(self, job_id: int) -> JobState:
        assert job_id == self.state.job_id
        return self.state


def _state(status: JobStatus, slurm_state: str, exit_code: int | None = None) -> JobState:
    return JobState(job_id=7, status=status, slurm_state=slurm_state, exit_code=exit_code)


DONE = _state(JobStatus.COMPLETED, "COMPLETED", 0)
RUNNING = _state(JobStatus.RUNNING, "RUNNING")
OWN = "script:/site/entrypoints/loop.py"


def _look(store, state, *, entrypoint="", since=1000.0, now=1010.0, stale_after_s=600.0):
    seen = watch.Seen(run="r1", job_id=7, since=since, stale_after_s=stale_after_s, entrypoint=entrypoint)
    event, _activity = watch.look(store, _OneJob(state), seen, now=now)
    return event


def test_an_entrypoint_that_ends_without_a_record_is_a_clear_failure(tmp_path):
    event = _look(LocalDirStore(tmp_path), DONE, entrypoint=OWN)
    assert event is not None and event["type"] == watch.NO_RECORDS
    message = event["message"]
    assert OWN in message and "wrote no longrun records" in message
    assert "training.api" in message and "docs/adopting.md" in message and "job 7" in message


def test_an_entrypoint_that_runs_long_without_a_record_is_a_clear_failure(tmp_path):
    store = LocalDirStore(tmp_path)
    assert _look(store, RUNNING, entrypoint=OWN, now=1500.0) is None  # within the grace period
    event = _look(store, RUNNING, entrypoint=OWN, now=1700.0)
    assert event is not None and event["type"] == watch.NO_RECORDS and event["age_s"] == 700.0
    assert "has run 700 s" in event["message"] and "docs/adopting.md" in event["message"]


@pytest.mark.parametrize(
    ("key", "record"),
    [
        ("segments/7.0-r0.json", {"segment_id": "7.0-r0"}),  # a segment of this job
        (schema.PROGRESS_PATH, {"step": 3, "time": 1005.0}),  # progress since the watch began
        (schema.REPORT_PATH, {"final_step": 40}),
    ],
)
def test_any_record_of_the_job_counts(tmp_path, key, record):
    store = LocalDirStore(tmp_path)
    put_json(store, schema.store_key("r1", key), record)
    event = _look(store, DONE, entrypoint=OWN)
    assert event is not None and event["type"] == watch.JOB_DONE and event["outcome"] == "success"


def test_an_earlier_jobs_records_do_not_count(tmp_path):
    store = LocalDirStore(tmp_path)
    put_json(store, schema.store_key("r1", "segments/6.0-r0.json"), {"segment_id": "6.0-r0"})
    put_json(store, schema.store_key("r1", schema.PROGRESS_PATH), {"step": 3, "time": 900.0})
    assert _look(store, DONE, entrypoint=OWN)["type"] == watch.NO_RECORDS


def test_the_reference_trainer_keeps_its_paths(tmp_path):
    """No entrypoint in Seen (the reference trainer): a clean end is job_done, a silent run is stale, as
    before; a failed job of any entrypoint is job_done with Slurm's verdict."""
    store = LocalDirStore(tmp_path)
    assert _look(store, DONE)["type"] == watch.JOB_DONE
    assert _look(store, RUNNING, now=1700.0)["type"] == watch.STALE
    failed = _state(JobStatus.FAILED, "FAILED", 1)
    assert _look(store, failed, entrypoint=OWN)["type"] == watch.JOB_DONE


def test_seen_carries_the_entrypoint_only_when_set():
    own = watch.Seen(run="r1", job_id=7, entrypoint=OWN)
    assert watch.seen_from_dict(watch.seen_to_dict(own)) == own
    assert "entrypoint" not in watch.seen_to_dict(watch.Seen(run="r1", job_id=7))
