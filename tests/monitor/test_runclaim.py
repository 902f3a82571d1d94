"""One run, one name (issue 10 item 7): the first run claims its name; another run with that name is
refused before anything reaches Slurm, unless it continues the run (a relaunch attempt)."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
from longrun import runclaim

from training.records import schema
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


def _run() -> str:
    return f"claim-{uuid.uuid4().hex[:8]}"


def test_a_second_run_with_the_same_name_is_refused_and_says_why(store: ObjectStore) -> None:
    run = _run()
    first = runclaim.claim(store, run, "manual__1", continues=False)
    assert first.dag_run_id == "manual__1"
    with pytest.raises(runclaim.RunNameInUse, match=r"in use: training_run run 'manual__1' claimed it"):
        runclaim.claim(store, run, "manual__2", continues=False)
    # The same DAG run again (a retried preflight) keeps its claim.
    assert runclaim.claim(store, run, "manual__1", continues=False) == first
    # A relaunch attempt of that run continues it.
    assert runclaim.claim(store, run, "incident__x__relaunch", continues=True) == first


def test_records_without_a_claim_count_as_in_use(store: ObjectStore) -> None:
    run = _run()
    put_json(store, schema.store_key(run, schema.PROGRESS_PATH), {"step": 3})
    with pytest.raises(runclaim.RunNameInUse, match="already holds its records"):
        runclaim.claim(store, run, "manual__1", continues=False)


def test_of_two_runs_racing_for_a_name_exactly_one_wins(store: ObjectStore) -> None:
    run = _run()
    results: dict[str, object] = {}
    start = threading.Barrier(2)

    def go(dag_run_id: str) -> None:
        start.wait(timeout=30)
        try:
            results[dag_run_id] = runclaim.claim(store, run, dag_run_id, continues=False)
        except runclaim.RunNameInUse as e:
            results[dag_run_id] = e

    threads = [threading.Thread(target=go, args=(f"manual__{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    won = [k for k, v in results.items() if isinstance(v, runclaim.RunClaim)]
    assert len(won) == 1 and len(results) == 2, results
    assert runclaim.read_claim(store, run).dag_run_id == won[0]  # type: ignore[union-attr]


# A claim as the code before the shared record readers wrote it (put_json: sorted keys, indent 1).
OLD_CLAIM = (
    b'{\n "claimed_at": 1764493964.512345,\n "dag_run_id": "manual__2026-11-30T09:12:44+00:00",\n'
    b' "kind": "run_claim",\n "run": "r1",\n "schema_version": 1\n}'
)


def test_a_claim_written_before_still_reads_and_is_written_the_same(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "store")
    store.put_bytes(runclaim.claim_key("r1"), OLD_CLAIM)
    held = runclaim.read_claim(store, "r1")
    assert held == runclaim.RunClaim(
        run="r1", dag_run_id="manual__2026-11-30T09:12:44+00:00", claimed_at=1764493964.512345
    )
    assert json.dumps(held.to_json(), sort_keys=True, indent=1).encode() == OLD_CLAIM
    with pytest.raises(runclaim.RunNameInUse, match="manual__2026-11-30T09:12:44"):
        runclaim.claim(store, "r1", "manual__other", continues=False)


GOOD = {"schema_version": 1, "kind": "run_claim", "run": "r1", "dag_run_id": "x", "claimed_at": 1.0}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"schema_version": None}, "'schema_version'"),
        ({"schema_version": 2}, "'schema_version'"),
        ({"kind": None}, "'kind'"),
        ({"kind": "security_event"}, "'kind'"),
        ({"run": None}, "'run'"),
        ({"run": "../x"}, "'run'"),
        ({"dag_run_id": None}, "'dag_run_id'"),
        ({"dag_run_id": ""}, "'dag_run_id'"),
        ({"dag_run_id": 7}, "'dag_run_id'"),
        ({"claimed_at": "now"}, "'claimed_at'"),
        ({"claimed_at": True}, "'claimed_at'"),
    ],
)
def test_claim_record_validation_names_the_field(change: dict, field: str) -> None:
    obj = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(schema.SchemaError, match=field):
        runclaim.RunClaim.from_json(obj)
    with pytest.raises(ValueError, match=field):  # what callers catch
        runclaim.RunClaim.from_json(json.dumps(obj))
    assert runclaim.RunClaim.from_json(GOOD).to_json() == GOOD
