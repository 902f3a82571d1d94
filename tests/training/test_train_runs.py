"""Clean runs: no false alerts over seeds and cadences, bit-identical weights across runs, launchers and
a resume from a checkpoint. Real processes, 4 gloo ranks on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from conftest import REPO, base_env, free_port

from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import get_json


@pytest.mark.parametrize(("seed", "recompute", "vote"), [(1, 1, 1), (2, 3, 2), (3, 4, 0)])
def test_clean_runs_raise_no_alert(launch, seed, recompute, vote):
    steps = 12
    run = launch(["--steps", str(steps), "--seed", str(seed), "--recompute-every", str(recompute),
                  "--vote-every", str(vote), "--checkpoint-every", "6"])  # fmt: skip
    assert run.rcs == [0] * 4, run.log()
    assert run.alerts() == []
    records = run.checks()
    assert {r["verdict"] for r in records} == {"pass"}
    count = {c: sum(r["check"] == c for r in records) for c in schema.CHECKS}
    expected_votes = len({s for s in range(1, steps + 1) if (vote and s % vote == 0) or s % 6 == 0})
    assert count == {"finite": steps, "recompute": steps // recompute, "weight_vote": expected_votes}
    report = run.report()
    assert report["final_step"] == steps and report["last_pass"]["finite"] == steps
    # the batches of checks reached the store too, one set per rank (the pick needs every rank's passes)
    batches = sorted((run.store_dir / "runs" / "run" / "checks").glob("*.jsonl"))
    stored = [json.loads(line) for p in batches for line in p.read_text().splitlines()]
    assert sorted({r["rank"] for r in stored}) == [0, 1, 2, 3]
    assert len(stored) == 4 * len(records) and {r["world_size"] for r in stored} == {4}


@pytest.mark.slow  # three 4-rank launches
def test_identical_weights_across_runs_launchers_and_resume(launch, tmp_path):
    common = ["--steps", "16", "--seed", "7", "--recompute-every", "4", "--vote-every", "4"]
    full = launch([*common, "--checkpoint-every", "8"], name="full")
    assert full.rcs == [0] * 4, full.log()
    ckpt = full.run_dir / "checkpoints" / "step-00000008"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["weight_vote"]["verdict"] == "pass"
    assert manifest["coverage"] == {"finite": 8, "recompute": 8, "weight_vote": 8}

    resumed = launch([*common, "--resume-from", str(ckpt)], name="resumed")
    assert resumed.rcs == [0] * 4, resumed.log()
    assert resumed.report()["final_fingerprint"] == full.report()["final_fingerprint"]
    assert min(r["step"] for r in resumed.checks()) == 9

    # The same run under torchrun, as the orchestrator's tests and users launch it.
    env = base_env(tmp_path, "n1,n2,n3,n4")
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), "-m", "training.train", "--run-dir", str(tmp_path / "torchrun"),
         *common],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    report = json.loads((tmp_path / "torchrun" / "report.json").read_text())
    assert report["final_fingerprint"] == full.report()["final_fingerprint"]


@pytest.mark.s3
def test_alert_and_records_reach_s3(launch, s3_store_env, monkeypatch):
    name = f"s3drill-{uuid.uuid4().hex[:8]}"  # the bucket may outlive this session
    run = launch(["--steps", "8", "--recompute-every", "4", "--checkpoint-every", "4", "--fault", "nan:6:3"],
                 name=name, env=dict(s3_store_env))  # fmt: skip
    assert run.rcs == [schema.EXIT_SDC_VERDICT] * 4, run.log()
    for key, value in s3_store_env.items():  # boto3 reads the credentials from the environment
        monkeypatch.setenv(key, value)
    store = store_from_env(dict(s3_store_env))
    prefix = schema.run_prefix(name)
    alerts = [i.key for i in store.list(prefix + "alerts/")]
    assert len(alerts) == 1
    alert = get_json(store, alerts[0])
    assert alert == run.alerts()[0]
    assert alert["suspect_ranks"] == [3] and alert["suspect_nodes"] == ["n4"]
    assert get_json(store, prefix + schema.PROGRESS_PATH)["step"] == 5
    assert store.head(prefix + schema.manifest_path(4)) is not None
    assert any(i.key.endswith(".jsonl") for i in store.list(prefix + "checks/"))
