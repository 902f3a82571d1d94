"""At most one incident per run acts at a time (issue 10 item 7): a second alert of the same job joins
the first incident; an alert of another job of the run waits for it; a finished or crashed holder never
blocks the run for good. On a local store and on SeaweedFS (whose conditional writes decide races)."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowSkipException
from longrun.incident import exclusive, record, runner, steps
from longrun.tasks import sdc_incident

from training.records import schema
from training.records.schema import SchemaError
from training.store.factory import store_from_env
from training.store.interface import ObjectStore, put_json
from training.store.local import LocalDirStore


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    if request.param == "local":
        return LocalDirStore(tmp_path / "store")
    env = dict(request.getfixturevalue("s3_store_env"))
    for k, v in env.items():  # boto3 reads the credentials from the environment
        monkeypatch.setenv(k, v)
    return store_from_env(env)


def _alert(run: str, step: int) -> dict:
    return schema.record(
        "alert", run=run, step=step, check="recompute", suspect_ranks=[1], suspect_nodes=["n2"], evidence={}
    )


def _incident(run: str, step: int, job_id: int, rank: int = 0) -> runner.Incident:
    key = schema.store_key(run, schema.alert_path(step, "recompute", f"r{rank:03d}-{1700000000 + step}"))
    return runner.Incident(
        run=run, alert_key=key, alert=_alert(run, step), job_id=job_id, run_params={"run_name": run}
    )


def _run() -> str:
    return f"excl-{uuid.uuid4().hex[:8]}"


def test_a_second_alert_of_the_same_job_joins_the_first_incident(store: ObjectStore) -> None:
    run = _run()
    first, second = _incident(run, 17, job_id=5), _incident(run, 17, job_id=5, rank=2)
    assert exclusive.enter(store, run=run, incident_id=first.incident_id, job_id=5).action == "act"
    steps.open_record(store, first)
    with pytest.raises(AirflowSkipException, match=f"joins incident {first.incident_id}"):
        sdc_incident.take_turn(store, second)
    rec = record.load(store, run=run, incident_id=first.incident_id)
    assert [j["alert_key"] for j in rec["joined"]] == [second.alert_key]
    assert exclusive.joined_to(store, run=run, incident_id=second.incident_id) == first.incident_id
    # The first incident's own retries still act.
    assert exclusive.enter(store, run=run, incident_id=first.incident_id, job_id=5).action == "act"


def test_an_alert_of_another_job_waits_until_the_holder_releases(store: ObjectStore) -> None:
    run = _run()
    first, later = _incident(run, 17, job_id=5), _incident(run, 30, job_id=6)
    assert exclusive.enter(store, run=run, incident_id=first.incident_id, job_id=5).action == "act"
    steps.open_record(store, first)
    turn = exclusive.enter(store, run=run, incident_id=later.incident_id, job_id=6)
    assert turn.action == "wait" and turn.holder.incident_id == first.incident_id
    assert not exclusive.release(store, run=run, incident_id=later.incident_id), "only the holder releases"
    assert exclusive.release(store, run=run, incident_id=first.incident_id)
    assert exclusive.enter(store, run=run, incident_id=later.incident_id, job_id=6).action == "act"


def test_a_finished_holder_does_not_block_the_run(store: ObjectStore) -> None:
    run = _run()
    first, later = _incident(run, 17, job_id=5), _incident(run, 30, job_id=6)
    exclusive.enter(store, run=run, incident_id=first.incident_id, job_id=5)
    steps.open_record(store, first)
    # It relaunched but its summary never ran (the task died): the lock is still there.
    first.event(store, "relaunched_running", fields={"status": record.RELAUNCHED})
    assert exclusive.enter(store, run=run, incident_id=later.incident_id, job_id=6).action == "act"


def test_of_two_incidents_racing_exactly_one_acts(store: ObjectStore) -> None:
    run = _run()
    incs = [_incident(run, 17, job_id=5, rank=r) for r in (0, 1)]
    got: dict[str, str] = {}
    start = threading.Barrier(2)

    def go(inc: runner.Incident) -> None:
        start.wait(timeout=30)
        got[inc.incident_id] = exclusive.enter(store, run=run, incident_id=inc.incident_id, job_id=5).action

    threads = [threading.Thread(target=go, args=(i,)) for i in incs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(got.values()) == ["act", "join"], got


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"schema_version": 2}, "schema_version"),
        ({"incident_id": ""}, "incident_id"),
        ({"job_id": "5"}, "job_id"),
        ({"acquired_at": None}, "acquired_at"),
        ({"acquired_at": "noon"}, "acquired_at"),
        ({"run": "bad run/name"}, "'run'"),
        ({"incident_id": 7}, "incident_id"),
        ({"kind": "incident"}, "'kind'"),
    ],
)
def test_lock_record_validation_names_the_field(change: dict, field: str) -> None:
    good = exclusive.IncidentLock(run="r1", incident_id="i", job_id=5, acquired_at=1.0)
    assert exclusive.IncidentLock.from_json(good.to_json()) == good
    with pytest.raises(ValueError, match=field):
        exclusive.IncidentLock.from_json({**good.to_json(), **change})


#: A lock as `enter` wrote it before the record was on the shared idiom (`put_json`: sorted, indent 1).
LOCK_WRITTEN = (
    b'{\n "acquired_at": 1767225600.5,\n "incident_id": "00000040-recompute-r000-1767225640",\n'
    b' "job_id": 4711,\n "kind": "incident_lock",\n "run": "r1",\n "schema_version": 1\n}'
)


@pytest.mark.parametrize("job_id", [b"4711", b"null"])
def test_a_lock_written_before_reads_and_writes_back_byte_for_byte(tmp_path: Path, job_id: bytes) -> None:
    written = LOCK_WRITTEN.replace(b"4711", job_id)
    lock = exclusive.IncidentLock.from_json(written)
    assert (lock.run, lock.incident_id, lock.acquired_at) == (
        "r1",
        "00000040-recompute-r000-1767225640",
        1767225600.5,
    )
    assert lock.job_id == (4711 if job_id == b"4711" else None)
    store = LocalDirStore(tmp_path)
    put_json(store, exclusive.lock_key("r1"), lock.to_json())
    assert store.get_bytes(exclusive.lock_key("r1")) == written
    assert exclusive.read(store, "r1")[0] == lock


def test_a_lock_without_job_id_is_refused_naming_it() -> None:
    obj = json.loads(LOCK_WRITTEN)
    del obj["job_id"]
    with pytest.raises(SchemaError, match="'job_id'"):
        exclusive.IncidentLock.from_json(obj)


def _holder_with_record(store: ObjectStore, body: bytes) -> tuple[str, runner.Incident, runner.Incident]:
    """A run whose lock is held (for job 5) by an incident whose record is `body`, and a newcomer of job 5."""
    run = _run()
    first, second = _incident(run, 17, job_id=5), _incident(run, 17, job_id=5, rank=2)
    assert exclusive.enter(store, run=run, incident_id=first.incident_id, job_id=5).action == "act"
    store.put_bytes(record.record_key(run, first.incident_id), body)
    return run, first, second


def _relaunched_but_malformed(run: str, inc: runner.Incident) -> bytes:
    """A holder record whose status says final (relaunched) but whose timeline does not read: the shared
    schema check passes it, the typed Incident refuses it."""
    rec = schema.record(
        "incident",
        run=run,
        incident_id=inc.incident_id,
        alert=inc.alert,
        timeline=[{"time": 1.0}],  # an event without its name
        mode="act",
        status=record.RELAUNCHED,
    )
    schema.validate("incident", rec)
    return json.dumps(rec).encode()


@pytest.mark.parametrize("body", ["not json", "malformed"])
def test_a_holder_record_that_does_not_read_keeps_the_lock_held_and_says_why(
    store: ObjectStore, body: str
) -> None:
    # Attack: the holder's record is garbage, or says "relaunched" (final) in a record that does not read.
    # A final status frees the lock; an unreadable one must not (it would let a second incident act).
    run = _run()
    first = _incident(run, 17, job_id=5)
    raw = b"{not json" if body == "not json" else _relaunched_but_malformed(run, first)
    run, first, second = _holder_with_record(store, raw)
    later = _incident(run, 30, job_id=6)
    for newcomer in (second, later):  # same job: no join either (its record cannot be written)
        turn = exclusive.enter(store, run=run, incident_id=newcomer.incident_id, job_id=newcomer.job_id)
        assert turn.action == "wait" and turn.holder.incident_id == first.incident_id
        assert record.record_key(run, first.incident_id) in turn.why
        assert "runbooks/relaunch-failed.md" in turn.why
    assert exclusive.read(store, run)[0].incident_id == first.incident_id, "the lock stays held"


def test_waiting_on_an_unreadable_holder_stops_naming_its_key_and_the_runbook(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, first, _ = _holder_with_record(store, b"[]")
    later = _incident(run, 30, job_id=6)
    monkeypatch.setattr(sdc_incident, "TURN_WAIT_S", -1.0)  # give up at the first look
    with pytest.raises(runner.IncidentStop) as stop:
        sdc_incident.take_turn(store, later)
    msg = str(stop.value)
    assert "does not read" in msg and record.record_key(run, first.incident_id) in msg
    assert "runbooks/relaunch-failed.md" in msg
    assert exclusive.read(store, run)[0].incident_id == first.incident_id


def test_an_unreadable_holder_past_the_ttl_frees_the_lock(store: ObjectStore) -> None:
    # The TTL is the lock's own (validated) age: a crashed holder never blocks the run for good.
    run, first, _ = _holder_with_record(store, b"{not json")
    old = exclusive.IncidentLock(run=run, incident_id=first.incident_id, job_id=5, acquired_at=1.0)
    put_json(store, exclusive.lock_key(run), old.to_json())
    later = _incident(run, 30, job_id=6)
    assert exclusive.enter(store, run=run, incident_id=later.incident_id, job_id=6).action == "act"
