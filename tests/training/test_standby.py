"""The warm standby (training.spares.standby): it trains only from a directive that names exactly its nodes.

The first tests are one process (no process group: rank 0 answers itself); the last ones are real
trainers, two gloo ranks, waiting for a directive the test writes into a real local store.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from helpers.outage_store import OutageStore

from training.dist import process_group_backend
from training.launch_records import LAUNCH_T0_ENV, newest_checkpoint_since
from training.nvrx.restart import in_job_resume_ref
from training.records import schema
from training.spares.directive import Directive
from training.spares.standby import AlertWatch, _launch_starts_at_directive, await_directive, predicted_nodes
from training.store.interface import put_json
from training.store.local import LocalDirStore

CKPT = "runs/sb/checkpoints/step-00000004/"


def _directive(**kw) -> Directive:
    base = dict(run="sb", job_id="5", attempt=1, nodes=("n1", "n3"), resume_from=CKPT, incident_id="i",
                exclude=("n2",), issued_at=time.time())  # fmt: skip
    return Directive(**{**base, **kw})


def _put(store, d: Directive, *, attempt: int = 1) -> None:
    put_json(store, schema.store_key("sb", f"directives/5-a{attempt:03d}.json"), d.to_json())


def _wait(store, nodes=("n1", "n3"), wait_s=0.3):
    return await_directive(store, run="sb", job_id="5", attempt=1, nodes=list(nodes), wait_s=wait_s, rank=0,
                           poll_s=0.02)  # fmt: skip


def test_a_directive_for_exactly_its_nodes_gives_the_checkpoint(tmp_path):
    store = LocalDirStore(tmp_path)
    _put(store, _directive(nodes=("n3", "n1")))
    # one entry per rank: two ranks on n1 are still the node n1
    assert _wait(store, nodes=("n1", "n1", "n3", "n3")) == CKPT


def test_a_store_outage_is_waited_through_not_read_as_a_refusal(tmp_path):
    """Rank 0 read a store that did not answer as an unusable directive and never trained (the fault matrix's
    spare_directive x S3 cell). Now it looks again until its wait runs out."""
    store = LocalDirStore(tmp_path)
    _put(store, _directive())
    down = OutageStore(store, down=3)
    assert _wait(down, wait_s=30.0) == CKPT
    assert down.refused == 3


@pytest.mark.parametrize(
    ("directive", "why"),
    [
        (_directive(nodes=("n1", "n4"), exclude=("n3",)), "another node"),
        (_directive(nodes=("n1",)), "fewer nodes"),
        (_directive(job_id="6"), "another job, at this job's key"),
        (_directive(run="other"), "another run"),
        (_directive(attempt=2), "another attempt"),
        (None, "no directive"),
    ],
)
def test_anything_else_never_trains(tmp_path, directive, why):
    store = LocalDirStore(tmp_path)
    if directive is not None:
        _put(store, directive)
    t0 = time.monotonic()
    assert _wait(store) is None, why
    assert time.monotonic() - t0 >= 0.3  # it waited out its bound: the supervisor stops it meanwhile


def test_a_malformed_directive_never_trains(tmp_path):
    store = LocalDirStore(tmp_path)
    store.put_bytes(schema.store_key("sb", "directives/5-a001.json"), b'{"kind": "directive", "nodes": "n1"}')
    assert _wait(store) is None


def test_the_prediction_follows_the_orchestrators_choice():
    held = ["n1", "n2", "n3", "n4"]
    assert predicted_nodes(held, {"n2"}, 3) == ["n1", "n3", "n4"]
    assert predicted_nodes(held, {"n2", "n9"}, 2) == ["n1", "n3"]
    assert predicted_nodes(held, {"n1", "n2"}, 3) is None


def test_the_suspects_are_those_of_the_alerts_since_the_step_began(tmp_path):
    store = LocalDirStore(tmp_path)
    now = time.time()
    put_json(
        store,
        schema.store_key("sb", "alerts/00000010-finite-a.json"),
        {"time": now - 100, "suspect_nodes": ["n1"]},
    )
    put_json(
        store,
        schema.store_key("sb", "alerts/00000020-recompute-b.json"),
        {"time": now, "suspect_nodes": ["n2"]},
    )
    store.put_bytes(schema.store_key("sb", "alerts/00000021-x-c.json"), b"not json")
    assert AlertWatch(store, "sb", since=now - 10).suspects() == {"n2"}


def test_the_suspects_are_read_once_and_a_new_alert_is_seen_on_the_next_look(tmp_path):
    store = LocalDirStore(tmp_path)
    now = time.time()
    watch = AlertWatch(store, "sb", since=now - 10)
    assert watch.suspects() == set()
    put_json(
        store,
        schema.store_key("sb", "alerts/00000010-finite-a.json"),
        {"time": now - 100, "suspect_nodes": ["n1"]},
    )
    assert watch.suspects() == set()  # raised before the step began: an earlier attempt's
    put_json(
        store,
        schema.store_key("sb", "alerts/00000020-recompute-b.json"),
        {"time": now, "suspect_nodes": ["n2"]},
    )
    assert watch.suspects() == {"n2"}
    # read once: a later rewrite of a key already read changes nothing (alerts are written once)
    put_json(
        store,
        schema.store_key("sb", "alerts/00000020-recompute-b.json"),
        {"time": now, "suspect_nodes": ["n4"]},
    )
    assert watch.suspects() == {"n2"}


def test_a_directed_launch_begins_at_the_directive(tmp_path, monkeypatch):
    """The standby started while the previous attempt's step was still ending: that step's last checkpoint
    (its manifest timed after the standby's start, before the directive) must not be what an in-job
    restart of the directed attempt resumes from; its own newer checkpoint still is."""
    store = LocalDirStore(tmp_path / "store")
    run_dir = tmp_path / "run"
    standby_t0 = time.time() - 20
    monkeypatch.setenv(LAUNCH_T0_ENV, f"{standby_t0:.9f}")
    d = _directive(issued_at=standby_t0 + 10)
    _put(store, d)

    def manifest(step: int, at: float) -> None:
        path = run_dir / schema.checkpoint_dir(step) / "manifest.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        rec = schema.record("manifest", run="sb", step=step, time=at, files=[], fingerprints={}, weight_vote={},
                            coverage={}, loss=None, code_version="x", world={})  # fmt: skip
        path.write_text(json.dumps(rec))

    manifest(20, standby_t0 + 5)  # the previous attempt's upload, finished after the standby started
    assert newest_checkpoint_since(run_dir, standby_t0) == str(run_dir / schema.checkpoint_dir(20))
    _launch_starts_at_directive(store, run="sb", job_id="5", attempt=1)
    assert float(os.environ[LAUNCH_T0_ENV]) == pytest.approx(d.issued_at)
    assert in_job_resume_ref(restart_count=1, default=CKPT, run_dir=run_dir, run="sb") == CKPT
    manifest(6, d.issued_at + 3)  # the directed attempt's own checkpoint: an in-job restart resumes there
    assert in_job_resume_ref(restart_count=1, default=CKPT, run_dir=run_dir, run="sb") == str(
        run_dir / schema.checkpoint_dir(6)
    )
    # a second incarnation reads the same directive: the same time, never later
    _launch_starts_at_directive(store, run="sb", job_id="5", attempt=1)
    assert float(os.environ[LAUNCH_T0_ENV]) == pytest.approx(d.issued_at)


def _when_waiting(log_path, then) -> threading.Thread:
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log_path.exists() and "standby: waiting" in log_path.read_text():
                then()
                return
            time.sleep(0.1)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@pytest.mark.slow  # three 2-rank launches
def test_a_standby_trainer_resumes_from_the_directed_checkpoint_and_nothing_else(launch, tmp_path):
    common = ["--steps", "8", "--seed", "3", "--recompute-every", "4", "--vote-every", "4"]
    first = launch([*common, "--checkpoint-every", "4"], name="sb", nodes="n1,n3")
    assert first.rcs == [0, 0], first.log()
    store = LocalDirStore(first.store_dir)
    assert store.head(schema.store_key("sb", schema.manifest_path(4)))
    segments = store.root / "runs" / "sb" / "segments"
    before = set(segments.glob("*.json"))
    job = {"SLURM_JOB_ID": "5", "LONGRUN_ATTEMPT": "1"}

    # directed elsewhere (the orchestrator kept n4, not n3): it never trains, writes no segment
    _put(store, _directive(nodes=("n1", "n4"), exclude=("n3",)))
    other = launch([*common, "--await-directive-s", "3"], name="sb", nodes="n1,n3", env=job)
    assert other.rcs == [2, 2], other.log()
    assert "not directed here" in other.logs[0] and "no directive for job 5 attempt 1" in other.logs[0]
    assert set(segments.glob("*.json")) == before

    # the directive comes while it waits, for exactly its nodes: it resumes from the directed checkpoint
    store.delete(schema.store_key("sb", "directives/5-a001.json"))
    watcher = _when_waiting(tmp_path / "sb.r0.log", lambda: _put(store, _directive()))
    run = launch([*common, "--await-directive-s", "120"], name="sb", nodes="n1,n3", env=job)
    watcher.join(timeout=5)
    assert run.rcs == [0, 0], run.log()
    (new,) = [json.loads(p.read_text()) for p in set(segments.glob("*.json")) - before]
    assert (new["start_step"], new["first_step"], new["resumed_from"]) == (4, 5, CKPT)
    assert run.report()["final_fingerprint"] == first.report()["final_fingerprint"]


def test_a_standby_puts_nothing_on_a_gpu_before_its_directive():
    """The rule only: this machine has no CUDA, so the device side (NCCL, exclusive-process GPUs) is not
    exercised here. A standby starts beside the alerting step, which still holds the GPUs: its group is
    gloo for CPU objects and NCCL for CUDA tensors, and the device is set only after the directive."""
    assert process_group_backend(cuda=False, claim_device=False) == "gloo"
    assert process_group_backend(cuda=False, claim_device=True) == "gloo"
    assert process_group_backend(cuda=True, claim_device=True) == "nccl"
    assert process_group_backend(cuda=True, claim_device=False) == "cpu:gloo,cuda:nccl"
