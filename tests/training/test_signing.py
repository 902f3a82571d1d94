"""The shared signing contract: canonical JSON, HMAC-SHA256, the job's EventWriter signing its alerts."""

from __future__ import annotations

import json
import math

import pytest

from training.events import EventWriter
from training.records import schema, signing


def _alert() -> dict:
    return schema.record(
        "alert",
        run="r1",
        step=7,
        check="recompute",
        suspect_ranks=[1],
        suspect_nodes=["n2"],
        evidence={"losses": [1.25, 0.1 + 0.2], "world": {"world_size": 3}},
    )


def test_canonical_json_is_sorted_compact_and_leaves_out_the_signature() -> None:
    a = {"b": 1, "a": [1, 2], "signature": "x"}
    assert signing.canonical_json(a) == b'{"a":[1,2],"b":1}'
    assert signing.canonical_json({"a": [1, 2], "b": 1}) == signing.canonical_json(a)
    with pytest.raises(ValueError):
        signing.canonical_json({"loss": math.nan})


def test_sign_verify_and_every_kind_of_tampering() -> None:
    key = signing.new_key()
    signed = signing.sign(_alert(), key)
    assert signing.verify(signed, key)
    # Survives the trip through a store (indented, key order changed).
    assert signing.verify(json.loads(json.dumps(signed, indent=1)), key)
    assert not signing.verify(_alert(), key)  # unsigned
    assert not signing.verify(signed, signing.new_key())  # another job's key
    assert not signing.verify({**signed, "suspect_nodes": ["n3"]}, key)
    assert not signing.verify({**signed, "job_id": 99}, key)
    assert not signing.verify({**signed, "signature": "hmac-sha256:" + "0" * 64}, key)
    assert not signing.verify({**signed, "signature": 5}, key)


def test_key_from_env_never_echoes_the_value() -> None:
    key = signing.new_key()
    assert signing.key_from_env({signing.KEY_ENV: key.hex()}) == key
    assert signing.key_from_env({}) is None
    with pytest.raises(ValueError) as e:
        signing.key_from_env({signing.KEY_ENV: "zz-not-hex-secret"})
    assert "zz-not-hex-secret" not in str(e.value)


def test_the_event_writer_signs_alerts_with_the_job_key(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = signing.new_key()
    monkeypatch.setenv(signing.KEY_ENV, key.hex())
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    w = EventWriter(run="r1", run_dir=tmp_path, store=None, rank=1, flush_every=5, progress_interval_s=1.0)
    path = w.alert(_alert())
    rec = json.loads(path.read_text())
    assert rec["job_id"] == 4242 and signing.verify(rec, key)
    assert key.hex() not in path.read_text()
    w.close()


def test_every_rank_writes_its_check_records(tmp_path) -> None:
    w = EventWriter(run="r1", run_dir=tmp_path, store=None, rank=2, flush_every=1, progress_interval_s=1.0)
    w.check(
        schema.record("check", run="r1", step=3, check="recompute", verdict="pass", rank=2, duration_s=0.1)
    )
    w.close()
    assert (tmp_path / schema.check_batch_path(3, 3, 2)).exists()
