"""`longrun checkpoints ...` over the store the environment names; clear one-line errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest
from ckpt_helpers import Saver
from longrun.checkpoints.cli import main

from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import ObjectStore
from training.store.local import LocalDirStore


@pytest.fixture
def cli_env(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    """Point the environment at `store` (the s3 variant's env is already set by its fixture)."""
    if isinstance(store, LocalDirStore):
        for k in ("AWS_ENDPOINT_URL", "LONGRUN_S3"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("LONGRUN_STORE_DIR", str(store.root))
    return store


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict]:
    rc = main([*argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_list_validate_promote_pick(
    cli_env: ObjectStore, run: str, save_checkpoints: Saver, capsys: pytest.CaptureFixture[str]
) -> None:
    save_checkpoints(cli_env, run, [10, 20], coverage=lambda s: {"recompute": s})
    cli_env.put_bytes(schema.store_key(run, schema.manifest_path(30)), b"not json")

    rc, out = _json(capsys, ["list", "--run", run])
    assert rc == 0 and [r["step"] for r in out["checkpoints"]] == [10, 20]
    assert all(r["validated"] is None and not r["promoted"] for r in out["checkpoints"])
    assert len(out["problems"]) == 1 and "step-00000030" in out["problems"][0]["key"]

    rc, out = _json(capsys, ["validate", "--run", run])  # every checkpoint not yet validated
    assert rc == 0 and [v["step"] for v in out["validations"]] == [10, 20]

    rc, out = _json(capsys, ["promote", "--run", run, "--step", "20"])
    assert rc == 0 and out["promoted"] and out["seq"] == 1
    rc, out = _json(capsys, ["promote", "--run", run, "--step", "30"])
    assert rc == 1 and not out["promoted"] and "unreadable" in out["error"]

    # The pick counts the check records of every rank (a manifest's coverage alone proves nothing).
    records = [
        schema.record("check", run=run, step=s, check=c, verdict="pass", rank=0, duration_s=0.1, world_size=1)
        for s in (10, 20)
        for c in ("recompute", "weight_vote")
    ]
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    cli_env.put_bytes(schema.store_key(run, schema.check_batch_path(10, 20, 0)), body)
    rc, out = _json(capsys, ["pick", "--run", run, "--check", "recompute", "--step", "25"])
    assert rc == 0 and out["step"] == 20 and out["key"].endswith("checkpoints/step-00000020/")

    rc, out = _json(capsys, ["list", "--run", run])
    assert [(r["step"], r["validated"], r["current"]) for r in out["checkpoints"]] == [
        (10, True, False),
        (20, True, True),
    ]
    assert main(["list", "--run", run]) == 0
    text = capsys.readouterr().out
    assert "current" in text and "problem:" in text


def test_validate_failure_exits_1_and_names_the_file(
    cli_env: ObjectStore, run: str, save_checkpoints: Saver, capsys: pytest.CaptureFixture[str]
) -> None:
    save_checkpoints(cli_env, run, [10])
    key = schema.store_key(run, schema.checkpoint_dir(10) + "extra.pt")
    data = cli_env.get_bytes(key)
    cli_env.put_bytes(key, data[:-1] + bytes([data[-1] ^ 4]))
    assert main(["validate", "--run", run, "--step", "10"]) == 1
    assert "error: extra.pt: sha256" in capsys.readouterr().out


def test_pick_without_an_alert_is_a_usage_error(
    cli_env: ObjectStore, run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pick", "--run", run]) == 2
    assert "no alert records" in capsys.readouterr().err
    assert main(["pick", "--run", run, "--check", "finite"]) == 2


def test_a_bad_run_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--run", "../etc"]) == 2
    assert "run name" in capsys.readouterr().err


def _cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "longrun.cli", "checkpoints", "list", "--run", "somerun"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.s3
def test_wrong_credentials_give_one_clear_line(s3_env: dict[str, str]) -> None:
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": uuid.uuid4().hex}
    proc = _cli(env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "credentials rejected" in lines[0] and s3_env["AWS_ENDPOINT_URL"] in lines[0]
    assert "AWS_SECRET_ACCESS_KEY" in lines[0]
    assert env["AWS_SECRET_ACCESS_KEY"] not in proc.stderr


def test_an_unreachable_store_gives_one_clear_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "LONGRUN_BUCKET": "ckpt",
        "AWS_ACCESS_KEY_ID": uuid.uuid4().hex,
        "AWS_SECRET_ACCESS_KEY": uuid.uuid4().hex,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    proc = _cli(env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "store unreachable" in lines[0] and f"127.0.0.1:{port}" in lines[0]


def test_list_shows_a_validation_that_does_not_read_and_pick_refuses_an_alert_that_does_not(
    cli_env: ObjectStore, run: str, save_checkpoints: Saver, capsys: pytest.CaptureFixture[str]
) -> None:
    """A validation that does not read is listed as a problem and its step as not passing (the gate
    refuses it); `pick` without --alert does not skip a newest alert that does not read."""
    save_checkpoints(cli_env, run, [10])
    assert main(["validate", "--run", run, "--step", "10"]) == 0
    capsys.readouterr()
    store = store_from_env()  # as the CLI sees it: validations are on the orchestrator's side
    bad = schema.store_key(run, schema.validation_path(10, "9999999999-garbled"))
    store.put_bytes(bad, b"{garbled")
    rc, out = _json(capsys, ["list", "--run", run])
    assert rc == 0 and [(r["step"], r["validated"]) for r in out["checkpoints"]] == [(10, False)]
    assert [p["key"] for p in out["problems"]] == [bad]

    alert = schema.record(
        "alert", run=run, step=5, check="recompute", suspect_ranks=[], suspect_nodes=[], evidence={}
    )
    store.put_bytes(schema.store_key(run, schema.alert_path(5, "recompute", "a")), json.dumps(alert).encode())
    newest = schema.store_key(run, schema.alert_path(9, "recompute", "b"))
    store.put_bytes(newest, b"{garbled")
    assert main(["pick", "--run", run, "--no-write"]) == 2
    assert newest in capsys.readouterr().err
