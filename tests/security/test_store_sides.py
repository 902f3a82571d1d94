"""Two sides of the store (issue 10, item 1) on real SeaweedFS with the stack's two identities.

Each attack here is performed with the job identity's keys, as a job (or anyone holding its keys) would.
Before the split the job held the orchestrator's keys and wrote the one bucket, so every write below went
through and the forged records were the ones the orchestrator read.
"""

from __future__ import annotations

import json
import uuid

import pytest
from longrun import records
from longrun.checkpoints.pick import pick_pre_incident
from longrun.health.ratelimit import LEDGER_KEY, entries, reserve_drain
from longrun.incident import record
from longrun.store_access import job_store_env
from longrun.ui.data import load_run_health

from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import NotFound, StoreAuthError, get_json, put_json
from training.store.local import LocalDirStore
from training.store.sides import JOB, ORCHESTRATOR, SidedStore, side_of


def _alert(run: str, step: int = 7) -> dict:
    return schema.record(
        "alert",
        run=run,
        step=step,
        check="finite",
        suspect_ranks=[1],
        suspect_nodes=["n2"],
        evidence={"nodes": ["n1", "n2", "n3"]},
    )


@pytest.fixture
def sides(s3_store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """(orchestrator store, job store, run name): each store built from the environment its side gets."""
    run = f"sides-{uuid.uuid4().hex[:8]}"
    orch_env = dict(s3_store_env)
    job_env = job_store_env(orch_env)
    assert job_env["AWS_ACCESS_KEY_ID"] != orch_env["AWS_ACCESS_KEY_ID"]
    assert orch_env["AWS_SECRET_ACCESS_KEY"] not in job_env.values()
    # boto3 takes the keys from the process environment: one store per identity, built under its env.
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(k, job_env[k] if k in job_env else orch_env[k])
    job = store_from_env(job_env)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, orch_env[k])
    orch = store_from_env(orch_env)
    assert isinstance(orch, SidedStore) and isinstance(job, SidedStore)
    return orch, job, run


@pytest.mark.s3
def test_job_identity_cannot_write_or_delete_the_orchestrator_side(sides) -> None:
    orch, job, run = sides
    alert_key = schema.store_key(run, schema.alert_path(7, "finite", "r001-0"))
    put_json(job, alert_key, _alert(run))  # the job's own record: allowed
    rec = record.open_incident(orch, run=run, alert=_alert(run), alert_key=alert_key, mode="act")
    inc_key = record.record_key(run, rec["incident_id"])
    reserve_drain(orch, incident_id=f"{run}-inc", node="n2", run=run)
    pointer = schema.store_key(run, schema.PROMOTED_POINTER_PATH)
    put_json(orch, pointer, {"step": 5})

    for key in (LEDGER_KEY, inc_key, pointer):
        with pytest.raises(StoreAuthError):
            job.put_bytes(key, b"{}")
        with pytest.raises(StoreAuthError):
            job.delete(key)
    with pytest.raises(StoreAuthError):
        job.get_bytes(LEDGER_KEY)  # not even read: the job learns nothing of other runs' drains
    # what the orchestrator wrote is intact
    assert [e["node"] for e in entries(orch) if e["run"] == run] == ["n2"]
    assert record.load(orch, run=run, incident_id=rec["incident_id"])["status"] == record.OPEN
    assert get_json(orch, pointer) == {"step": 5}


@pytest.mark.s3
def test_forged_orchestrator_records_in_the_job_bucket_are_never_read(
    sides, s3_store_env: dict[str, str]
) -> None:
    """The job bucket is the job's: whatever it puts there at an orchestrator key is not what the
    orchestrator reads (a forged promotion, incident or ledger)."""
    orch, job, run = sides
    pointer = schema.store_key(run, schema.PROMOTED_POINTER_PATH)
    forged_inc = schema.store_key(run, schema.incident_path("forged"))
    for key in (pointer, forged_inc, LEDGER_KEY):
        job.job.put_bytes(key, b'{"forged": true}')  # straight into the job bucket, which it may write
    try:
        with pytest.raises(NotFound):
            orch.get_bytes(pointer)
        with pytest.raises(NotFound):
            orch.get_bytes(forged_inc)
        assert all(e.get("forged") is None for e in entries(orch))
        listed = [i.key for i in orch.list(schema.run_prefix(run))]
        assert pointer not in listed and forged_inc not in listed
    finally:
        for key in (pointer, forged_inc, LEDGER_KEY):
            job.job.delete(key)


@pytest.mark.s3
def test_job_writes_its_run_and_reads_its_directives_orchestrator_reads_both(sides) -> None:
    orch, job, run = sides
    progress = schema.store_key(run, schema.PROGRESS_PATH)
    ckpt = schema.store_key(run, schema.checkpoint_dir(10) + "model.pt")
    put_json(job, progress, {"step": 3})
    job.put_bytes(ckpt, b"weights")
    directive = schema.store_key(run, "directives/00000001.json")
    put_json(orch, directive, {"attempt": 2})
    assert get_json(job, directive) == {"attempt": 2}
    with pytest.raises(StoreAuthError):
        job.put_bytes(directive, b'{"attempt": 99}')
    assert get_json(orch, progress) == {"step": 3}
    assert orch.get_bytes(ckpt) == b"weights"
    listed = [i.key for i in orch.list(schema.run_prefix(run))]
    assert listed == sorted(listed) and {progress, ckpt, directive} <= set(listed)


@pytest.mark.s3
def test_job_identity_uploads_a_multipart_checkpoint(sides, tmp_path, s3_store_env, monkeypatch) -> None:
    """Large checkpoints go up in parts: the job identity's Write covers multipart uploads too."""
    from training.store.s3 import S3Store

    _orch, job, run = sides
    env = job_store_env(dict(s3_store_env))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", env["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", env["AWS_SECRET_ACCESS_KEY"])
    small_parts = S3Store(
        bucket=env["LONGRUN_BUCKET"], endpoint_url=env["AWS_ENDPOINT_URL"], multipart_threshold=5 << 20
    )
    path = tmp_path / "model.pt"
    path.write_bytes(bytes(range(256)) * (24 << 10))  # 6 MiB, above the threshold: a multipart upload
    key = schema.store_key(run, schema.checkpoint_dir(20) + "model.pt")
    info = small_parts.put_file(key, path)
    assert info.size == 6 << 20 and job.head(key) is not None


@pytest.mark.s3
def test_readers_find_orchestrator_kinds_on_the_orchestrator_side(
    sides, s3_store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The records CLI and the checkpoint pick keep their keys; the kinds they write and read are in the
    orchestrator bucket, the job's in the job bucket."""
    orch, _job, run = sides
    alert_key = schema.store_key(run, schema.alert_path(7, "finite", "r001-0"))
    put_json(orch, alert_key, _alert(run))
    rec = record.open_incident(orch, run=run, alert=_alert(run), alert_key=alert_key, mode="act")
    step, _why = pick_pre_incident(orch, run, _alert(run), write=True)
    assert step is None  # no checkpoint: the pick says so, and records it
    assert isinstance(orch, SidedStore)
    assert orch.orchestrator.head(record.record_key(run, rec["incident_id"])) is not None
    assert any(i.key.split("/")[2] == "picks" for i in orch.orchestrator.list(schema.run_prefix(run)))
    assert orch.job.head(alert_key) is not None and orch.orchestrator.head(alert_key) is None

    for k, v in s3_store_env.items():
        monkeypatch.setenv(k, v)
    assert records.main(["show", "--run", run, "--kind", "incidents"]) == 0
    assert json.loads(capsys.readouterr().out)["incident_id"] == rec["incident_id"]
    assert records.main(["list", "--run", run]) == 0
    out = capsys.readouterr().out
    assert alert_key in out and "/incidents/" in out and "/picks/" in out

    # The UI's run-health page: the alert from the job side, the incident from the orchestrator side, and
    # not an incident the job forged in its own bucket.
    forged = schema.store_key(run, schema.incident_path("forged"))
    orch.job.put_bytes(forged, json.dumps(rec).encode())
    try:
        health = load_run_health(orch, run)
        assert [i.incident_id for i in health.incidents] == [rec["incident_id"]]
        assert any(e.verdict == "alert" and e.step == 7 for e in health.checks)
    finally:
        orch.job.delete(forged)


# ---- no server needed --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "side"),
    [
        ("runs/r/alerts/00000001-finite-x.json", JOB),
        ("runs/r/checks/00000001-00000002-r000.jsonl", JOB),
        ("runs/r/progress/latest.json", JOB),
        ("runs/r/checkpoints/step-00000010/manifest.json", JOB),
        ("runs/r/saves/step-00000010.json", JOB),
        ("runs/r/report.json", JOB),
        ("runs/r/incidents/i.json", ORCHESTRATOR),
        ("runs/r/validations/step-00000010-x.json", ORCHESTRATOR),
        ("runs/r/promoted/current.json", ORCHESTRATOR),
        ("runs/r/picks/00000007-x.json", ORCHESTRATOR),
        ("runs/r/suspect/x.json", ORCHESTRATOR),
        ("runs/r/directives/00000001.json", ORCHESTRATOR),
        ("runs/r/report.json.bak", ORCHESTRATOR),
        ("runs/r/alertsX/x.json", ORCHESTRATOR),
        (LEDGER_KEY, ORCHESTRATOR),
        ("audit/2026-11-29/summary.json", ORCHESTRATOR),
        ("nodes/n2/history.json", ORCHESTRATOR),
        ("something-new/x.json", ORCHESTRATOR),
    ],
)
def test_side_of(key: str, side: str) -> None:
    assert side_of(key) == side


def test_local_sided_store_routes_and_merges(tmp_path) -> None:
    store = store_from_env(
        {"LONGRUN_STORE_DIR": str(tmp_path / "j"), "LONGRUN_ORCH_STORE_DIR": str(tmp_path / "o")}
    )
    assert isinstance(store, SidedStore)
    store.put_bytes("runs/r/alerts/a.json", b"1")
    store.put_bytes("runs/r/incidents/i.json", b"2")
    store.put_bytes(LEDGER_KEY, b"3")
    assert (tmp_path / "j" / "runs/r/alerts/a.json").is_file()
    assert (tmp_path / "o" / "runs/r/incidents/i.json").is_file()
    assert (tmp_path / "o" / LEDGER_KEY).is_file()
    assert [i.key for i in store.list("")] == [LEDGER_KEY, "runs/r/alerts/a.json", "runs/r/incidents/i.json"]
    assert [i.key for i in store.list("runs/r/in")] == ["runs/r/incidents/i.json"]
    # a stray orchestrator key in the job directory is not listed
    LocalDirStore(tmp_path / "j").put_bytes("runs/r/promoted/current.json", b"forged")
    assert "runs/r/promoted/current.json" not in [i.key for i in store.list("runs/r/")]
    # folders: each side's where its keys can lie, merged once each; the stray folder is not one
    store.put_bytes("runs/s/checks/00000001-00000001-r000.jsonl", b"4")
    store.put_bytes("runs/r/checks/00000001-00000001-r000.jsonl", b"5")
    assert list(store.list_dirs("runs/")) == ["runs/r/", "runs/s/"]
    assert list(store.list_dirs("runs/r/")) == ["runs/r/alerts/", "runs/r/checks/", "runs/r/incidents/"]
    assert list(store.list_dirs("")) == [LEDGER_KEY.split("/")[0] + "/", "runs/"]


def test_job_store_env_never_hands_out_the_orchestrator_keys() -> None:
    orch = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
        "AWS_ACCESS_KEY_ID": "ORCH",
        "AWS_SECRET_ACCESS_KEY": "orch-secret",
        "LONGRUN_BUCKET": "b1",
        "LONGRUN_ORCH_BUCKET": "b1-orchestrator",
        "LONGRUN_JOB_ACCESS_KEY_ID": "JOB",
        "LONGRUN_JOB_SECRET_ACCESS_KEY": "job-secret",
        "AIRFLOW__CORE__FERNET_KEY": "x",
    }
    env = job_store_env(orch)
    assert env == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
        "AWS_ACCESS_KEY_ID": "JOB",
        "AWS_SECRET_ACCESS_KEY": "job-secret",
        "LONGRUN_BUCKET": "b1",
        "LONGRUN_ORCH_BUCKET": "b1-orchestrator",
    }
    # two sides but no job keys: the job brings its own (instance role), never the orchestrator's
    no_job = {k: v for k, v in orch.items() if not k.startswith("LONGRUN_JOB_")}
    assert "AWS_ACCESS_KEY_ID" not in job_store_env(no_job)
    # one side (the old layout): nothing to protect, the keys are shared as before
    assert (
        job_store_env({k: v for k, v in no_job.items() if k != "LONGRUN_ORCH_BUCKET"})["AWS_ACCESS_KEY_ID"]
        == "ORCH"
    )
    with pytest.raises(ValueError, match="both"):
        job_store_env({**no_job, "LONGRUN_JOB_ACCESS_KEY_ID": "JOB"})


def test_a_sided_store_travels_to_another_process_as_a_spec(tmp_path) -> None:
    """The checkpoint writer rebuilds the store in its own process from `store_spec`."""
    from training.store.factory import store_from_spec, store_spec

    store = store_from_env(
        {"LONGRUN_STORE_DIR": str(tmp_path / "j"), "LONGRUN_ORCH_STORE_DIR": str(tmp_path / "o")}
    )
    spec = store_spec(store)
    assert spec == {
        "kind": "sided",
        "job": {"kind": "local", "root": str(tmp_path / "j")},
        "orchestrator": {"kind": "local", "root": str(tmp_path / "o")},
    }
    again = store_from_spec(json.loads(json.dumps(spec)))
    assert isinstance(again, SidedStore)
    again.put_bytes("runs/r/incidents/i.json", b"x")
    assert (tmp_path / "o" / "runs/r/incidents/i.json").is_file()


def test_an_s3_sided_store_builds_one_client_for_both_buckets() -> None:
    """Each bucket keeps its own name; the client (endpoint and credentials, no bucket) is built once."""
    store = store_from_env(
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
            "AWS_ACCESS_KEY_ID": "ORCH",
            "AWS_SECRET_ACCESS_KEY": "orch-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "LONGRUN_BUCKET": "run-data",
            "LONGRUN_ORCH_BUCKET": "run-orchestrator",
        }
    )
    assert isinstance(store, SidedStore)
    job, orch = store.job, store.orchestrator
    assert (job.bucket, orch.bucket) == ("run-data", "run-orchestrator")  # type: ignore[attr-defined]
    assert job.client is orch.client  # type: ignore[attr-defined]
