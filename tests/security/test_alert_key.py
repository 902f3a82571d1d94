"""The `alert_key` record (`longrun.alert_auth.AlertKey`): records the earlier, dict-based code wrote
still read and are written again byte for byte; a malformed one is refused naming the field, and the
gate treats it as no key. Runs on a local directory store; no Slurm (a `JobState` is built by hand)."""

from __future__ import annotations

import json

import pytest
from longrun import alert_auth
from longrun.alert_auth import AlertKey
from longrun.slurm.models import JobState, JobStatus

from training.records.schema import SchemaError
from training.store.interface import put_json
from training.store.local import LocalDirStore

KEY_HEX = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
TAG = "longrun:training_run:manual__2026-01-01:r1"
#: As `issue` wrote it before the record had a type.
TAG_RECORD = (
    '{"schema_version": 1, "kind": "alert_key", "run": "r1", "tag": "' + TAG + '", "key": "' + KEY_HEX + '",'
    ' "time": 1767225600.25}'
)
#: As `bind` wrote it: the tag's record plus the job id.
JOB_RECORD = TAG_RECORD[:-1] + ', "job_id": 4711}'


@pytest.mark.parametrize("text", [TAG_RECORD, JOB_RECORD])
def test_a_record_written_before_reads_and_writes_back_the_same(tmp_path, text: str) -> None:
    obj = json.loads(text)
    rec = AlertKey.from_json(text)
    assert (rec.run, rec.tag, rec.key, rec.time) == ("r1", TAG, KEY_HEX, 1767225600.25)
    assert rec.job_id == obj.get("job_id")
    assert rec.to_json() == obj
    store = LocalDirStore(tmp_path)
    put_json(store, "a.json", obj)
    put_json(store, "b.json", rec.to_json())
    assert store.get_bytes("a.json") == store.get_bytes("b.json")


def test_an_integer_time_is_written_back_as_written(tmp_path) -> None:
    obj = {**json.loads(TAG_RECORD), "time": 1767225600}
    store = LocalDirStore(tmp_path)
    put_json(store, alert_auth._tag_key(TAG), obj)
    alert_auth.bind(store, run="r1", tag=TAG, job_id=4711)
    assert (
        store.get_bytes(alert_auth._job_key(4711))
        == json.dumps({**obj, "job_id": 4711}, sort_keys=True, indent=1).encode()
    )


def test_a_field_this_reader_does_not_know_is_kept() -> None:
    obj = {**json.loads(JOB_RECORD), "note": "from a newer writer"}
    assert AlertKey.from_json(obj).to_json() == obj


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"key": 7}, "'key'"),
        ({"key": None}, "'key'"),
        ({"run": None}, "'run'"),
        ({"job_id": "4711"}, "'job_id'"),
        ({"tag": ["x"]}, "'tag'"),
        ({"time": "noon"}, "'time'"),
        ({"kind": "alert"}, "'kind'"),
        ({"schema_version": 2}, "'schema_version'"),
    ],
)
def test_a_malformed_record_is_refused_naming_the_field(change: dict, field: str) -> None:
    with pytest.raises(SchemaError, match=field):
        AlertKey.from_json({**json.loads(JOB_RECORD), **change})


def _state(comment: str = TAG, job_id: int = 4711) -> JobState:
    return JobState(
        job_id=job_id, status=JobStatus.RUNNING, slurm_state="RUNNING", name="r1", comment=comment
    )


def test_issue_bind_and_the_gate_read_the_typed_record(tmp_path) -> None:
    store = LocalDirStore(tmp_path)
    key = alert_auth.issue(store, run="r1", tag=TAG)
    assert alert_auth.issue(store, run="r1", tag=TAG) == key  # a retry gets the same key
    written = json.loads(store.get_bytes(alert_auth._tag_key(TAG)))
    assert list(written) == ["key", "kind", "run", "schema_version", "tag", "time"]
    assert (written["kind"], written["run"], written["tag"], written["key"]) == (
        "alert_key",
        "r1",
        TAG,
        key.hex(),
    )
    alert_auth.bind(store, run="r1", tag=TAG, job_id=4711)
    assert json.loads(store.get_bytes(alert_auth._job_key(4711))) == {**written, "job_id": 4711}
    assert alert_auth.job_key(store, _state(), "r1") == key
    assert alert_auth.job_key(store, _state(comment=""), "r1") == key  # Slurm forgot the comment
    assert alert_auth.job_key(store, _state(), "r2") is None  # another run
    assert alert_auth.job_key(store, _state(comment="other-tag"), "r1") is None
    with pytest.raises(RuntimeError, match="another run"):
        alert_auth.issue(store, run="r2", tag=TAG)


def test_a_job_id_slurm_gave_to_a_new_job_is_bound_to_the_new_jobs_key(tmp_path) -> None:
    """Slurm reuses an id once its job is gone (a slurmctld that died before saving a job it had accepted
    forgets it and hands the id to the next submission). The binding used to be written once: the new
    job's key was never bound, and every alert it signed was refused as `no_key`."""
    store = LocalDirStore(tmp_path)
    other = "longrun/training_run/manual__b/submit/-1/1"
    alert_auth.issue(store, run="r1", tag=TAG)
    alert_auth.bind(store, run="r1", tag=TAG, job_id=4711)  # the job Slurm then lost
    new_key = alert_auth.issue(store, run="r2", tag=other)
    alert_auth.bind(store, run="r2", tag=other, job_id=4711)  # sbatch answered 4711 for r2's job
    assert alert_auth.bound_tag(store, run="r2", job_id=4711) == other
    assert alert_auth.bound_tag(store, run="r1", job_id=4711) is None
    assert alert_auth.job_key(store, _state(comment=other), "r2") == new_key
    assert alert_auth.job_key(store, _state(comment=TAG), "r1") is None
    alert_auth.bind(store, run="r2", tag=other, job_id=4711)  # a retry: the same binding stands
    assert alert_auth.bound_tag(store, run="r2", job_id=4711) == other


def test_the_gate_reads_a_malformed_key_record_as_no_key(tmp_path) -> None:
    store = LocalDirStore(tmp_path)
    put_json(store, alert_auth._job_key(4711), {**json.loads(JOB_RECORD), "job_id": "4711"})
    assert alert_auth.job_key(store, _state(comment=""), "r1") is None
    put_json(store, alert_auth._job_key(4711), json.loads(JOB_RECORD))
    assert alert_auth.job_key(store, _state(comment=""), "r1") == bytes.fromhex(KEY_HEX)
