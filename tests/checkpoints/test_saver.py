"""CheckpointSaver and load_checkpoint, on both stores; faults: outage, interrupted upload, dead worker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch
from ckpt_helpers import Saver, tiny_state
from longrun.checkpoints import catalog
from longrun.checkpoints.validate import validate

from training.checkpoint.load import load_checkpoint
from training.checkpoint.manifest import CheckpointError
from training.checkpoint.saver import CheckpointSaver
from training.checkpoint.settings import SaverSettings
from training.fingerprint.host import fingerprint_state
from training.records import schema
from training.store.factory import store_spec
from training.store.interface import ObjectStore
from training.store.local import LocalDirStore
from training.store.s3 import S3Store


def _fast(writer: str = "thread", **kw: float) -> SaverSettings:
    return SaverSettings(writer=writer, retry_deadline_s=kw.get("retry", 10), wait_timeout_s=120)


@pytest.mark.parametrize("writer", ["thread", "nvrx"])
def test_save_then_load_from_store_and_run_dir(
    store: ObjectStore, run: str, tmp_path: Path, writer: str
) -> None:
    model, optim = tiny_state(1)
    fps = fingerprint_state(model)
    with CheckpointSaver(run=run, run_dir=tmp_path, store=store, settings=_fast(writer)) as saver:
        saver.save(
            step=40,
            model_state=model,
            optim_state=optim,
            extra={"data_pos": 123, "rng": torch.get_rng_state()},
            manifest_fields={
                "fingerprints": fps,
                "loss": 0.5,
                "world": {"world_size": 3},
                "code_version": "abc",
            },
        )
        assert saver.wait(120)
    [result] = saver.results
    assert result.ok and result.uploaded and result.writer == writer, result
    assert saver.last_error is None

    for loaded in (
        load_checkpoint(schema.store_key(run, schema.checkpoint_dir(40)), store),
        load_checkpoint(tmp_path / schema.checkpoint_dir(40)),
    ):
        assert loaded.step == 40
        assert loaded.model_state.keys() == model.keys()
        assert all(torch.equal(loaded.model_state[k], model[k]) for k in model)
        assert loaded.optim_state["param_groups"] == optim["param_groups"]
        assert torch.equal(loaded.optim_state["state"][0]["exp_avg"], optim["state"][0]["exp_avg"])
        assert loaded.extra["data_pos"] == 123
        m = loaded.manifest
        assert m["kind"] == "manifest" and m["run"] == run and m["fingerprints"] == fps
        assert m["world"] == {"world_size": 3} and m["code_version"] == "abc" and m["loss"] == 0.5
        assert [f["name"] for f in m["files"]] == ["model.pt", "optim.pt", "extra.pt"]
        assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in m["files"])
    rec = json.loads(store.get_bytes(schema.store_key(run, schema.save_path(40))))
    assert rec["ok"] and rec["writer"] == writer


def test_local_only_save_without_a_store(tmp_path: Path) -> None:
    model, _ = tiny_state(2)
    with CheckpointSaver(run="r", run_dir=tmp_path, settings=_fast()) as saver:
        saver.save(step=3, model_state=model)
    assert saver.results[0].ok and not saver.results[0].uploaded
    loaded = load_checkpoint(tmp_path / schema.checkpoint_dir(3))
    # Without the caller's fingerprints the saver fingerprints the snapshot itself.
    assert loaded.manifest["fingerprints"] == fingerprint_state(model)


def test_snapshot_is_taken_when_save_returns(store: ObjectStore, run: str, tmp_path: Path) -> None:
    model = {"w": torch.zeros(256, 256)}
    with CheckpointSaver(run=run, run_dir=tmp_path, store=store, settings=_fast()) as saver:
        saver.save(step=1, model_state=model)
        model["w"].add_(1.0)  # training goes on and changes the weights in place
    loaded = load_checkpoint(schema.store_key(run, schema.checkpoint_dir(1)), store)
    assert float(loaded.model_state["w"].abs().sum()) == 0.0


def test_save_returns_before_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shown by the order of events, not by timing: the real write is held at a gate until save() has
    returned, so a save() that wrote in the caller (or waited for the write) would find it still shut."""
    import threading

    from training.checkpoint import saver as checkpointing

    real_write = checkpointing.write_payload
    gate = threading.Event()
    seen: dict[str, object] = {}

    def gated_write(ckpt_dir: Path, item: object) -> None:  # the real write, run once the gate opens
        seen["thread"] = threading.current_thread()
        seen["opened"] = gate.wait(120)
        real_write(ckpt_dir, item)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpointing, "write_payload", gated_write)
    store = LocalDirStore(tmp_path / "store")
    model = {"w": torch.randn(1 << 16)}
    with CheckpointSaver(run="r", run_dir=tmp_path / "run", store=store, settings=_fast()) as saver:
        ckpt = saver.save(step=1, model_state=model)
        assert saver.pending() == 1 and not (ckpt / "manifest.json").exists()  # returned; nothing written
        gate.set()
        assert saver.wait(120)
    assert seen["opened"] is True, "save() did not return while its write was held"
    assert seen["thread"] is not threading.current_thread()
    assert saver.results[0].ok and (ckpt / "manifest.json").exists()
    loaded = load_checkpoint(schema.store_key("r", schema.checkpoint_dir(1)), store)
    assert torch.equal(loaded.model_state["w"], model["w"])


def test_a_published_step_is_never_overwritten(store: ObjectStore, run: str, tmp_path: Path) -> None:
    first, _ = tiny_state(1)
    second, _ = tiny_state(2)
    with CheckpointSaver(run=run, run_dir=tmp_path, store=store, settings=_fast()) as saver:
        saver.save(step=5, model_state=first)
        assert saver.wait(60)
        saver.save(step=5, model_state=second)
        assert saver.wait(60)
    assert [r.ok for r in saver.results] == [True, False]
    assert "already exists" in (saver.last_error or "")
    loaded = load_checkpoint(schema.store_key(run, schema.checkpoint_dir(5)), store)
    assert torch.equal(loaded.model_state["0.weight"], first["0.weight"])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again on exit: connections are refused


@pytest.mark.parametrize("writer", ["thread", "nvrx"])
def test_s3_outage_is_retried_then_reported_while_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    # Test credentials generated here; the endpoint is a real closed port on 127.0.0.1.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", uuid.uuid4().hex)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", uuid.uuid4().hex)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store = S3Store(bucket="ckpt", endpoint_url=f"http://127.0.0.1:{_closed_port()}", max_attempts=2)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = SaverSettings(writer=writer, retry_deadline_s=2.0, wait_timeout_s=120)
    steps_during_save = 0
    with CheckpointSaver(run="outage", run_dir=tmp_path, store=store, settings=settings) as saver:
        saver.save(step=10, model_state=model.state_dict(), optim_state=opt.state_dict())
        deadline = time.monotonic() + 60
        while saver.pending() and time.monotonic() < deadline:  # the training loop keeps stepping
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            steps_during_save += 1
            time.sleep(0.01)
        assert saver.wait(60)
    assert steps_during_save > 10
    [result] = saver.results
    assert not result.ok and not result.uploaded
    assert "gave up after" in (result.error or "") and "attempts" in (result.error or "")
    assert "127.0.0.1" in (result.error or "")
    rec = json.loads((tmp_path / schema.save_path(10)).read_text())
    assert rec["kind"] == "save" and rec["ok"] is False and "gave up" in rec["error"]
    # The local checkpoint is complete: it can be uploaded or used later.
    assert load_checkpoint(tmp_path / schema.checkpoint_dir(10)).step == 10


_CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    from training.checkpoint.saver import CheckpointSaver, SaverSettings
    from training.store.factory import store_from_spec

    def main():
        spec, run, run_dir = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
        store = store_from_spec(spec)
        state = {"w%d" % i: torch.randn(4 << 20) for i in range(3)}  # 48 MiB in each file
        saver = CheckpointSaver(run=run, run_dir=run_dir, store=store, settings=SaverSettings(writer="thread"))
        saver.save(step=7, model_state=state, optim_state={"state": dict(state)})
        print("saving", flush=True)
        saver.wait(300)
        saver.close()

    if __name__ == "__main__":
        main()
    """
)


def test_an_interrupted_upload_never_becomes_visible(store: ObjectStore, run: str, tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    prefix = schema.store_key(run, schema.checkpoint_dir(7))
    proc = subprocess.Popen(
        [sys.executable, str(script), json.dumps(store_spec(store)), run, str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if any(True for _ in store.list(prefix)):
                break  # the first payload object is up, the rest (and the manifest) are not
            time.sleep(0.01)
        assert proc.poll() is None, "the child finished before it could be interrupted"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()
    keys = [i.key for i in store.list(prefix)]
    assert keys and not any(k.endswith("manifest.json") for k in keys), keys
    cat = catalog.checkpoints(store, run)
    assert cat.checkpoints == ()
    assert [p.error.split(":")[0] for p in cat.problems] == ["incomplete"]
    rec = validate(store, run, 7)
    assert not rec["ok"] and rec["errors"][0].startswith("manifest.json: missing")
    with pytest.raises(CheckpointError, match="not a \\(complete\\) checkpoint"):
        load_checkpoint(prefix, store)


def test_a_dead_nvrx_worker_is_reported_and_saving_goes_on(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "store")
    model, _ = tiny_state(3)
    with CheckpointSaver(run="r", run_dir=tmp_path / "run", store=store, settings=_fast("nvrx")) as saver:
        saver.save(step=1, model_state=model)
        assert saver.wait(120) and saver.results[0].ok
        worker = saver._uploader._caller.process  # type: ignore[union-attr]  # the worker this test started
        assert worker is not None and worker.is_alive()
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(30)
        saver.save(step=2, model_state=model)
        assert saver.wait(120)
        saver.save(step=3, model_state=model)
        assert saver.wait(120)
    by_step = {r.step: r for r in saver.results}
    assert by_step[3].ok and by_step[3].writer == "thread"
    # Step 2 either raced the kill (reported failed) or already went through the fallback.
    assert by_step[2].ok or "worker died" in (by_step[2].error or "")


def test_manifest_fields_are_checked_at_save(tmp_path: Path) -> None:
    with CheckpointSaver(run="r", run_dir=tmp_path, settings=_fast()) as saver:
        with pytest.raises(ValueError, match="'step'"):
            saver.save(step=1, model_state={}, manifest_fields={"step": 3})
        with pytest.raises(ValueError, match="JSON"):
            saver.save(step=1, model_state={}, manifest_fields={"loss": object()})
        with pytest.raises(ValueError, match="step"):
            saver.save(step=-1, model_state={})
    with pytest.raises(RuntimeError, match="after close"):
        saver.save(step=1, model_state={})
    saver.close()  # idempotent


def test_settings_name_the_bad_field() -> None:
    with pytest.raises(ValueError, match="writer"):
        SaverSettings(writer="fork")
    with pytest.raises(ValueError, match="max_pending"):
        SaverSettings(max_pending=0)
    with pytest.raises(ValueError, match="retry_deadline_s"):
        SaverSettings(retry_deadline_s=-1)


def test_helper_saves_checkpoints(store: ObjectStore, run: str, save_checkpoints: Saver) -> None:
    states = save_checkpoints(store, run, [10, 20])
    assert [c.step for c in catalog.checkpoints(store, run).checkpoints] == [10, 20]
    assert set(states) == {10, 20}


def test_reused_snapshot_buffers_never_leak_between_checkpoints(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "store")
    w = torch.zeros(64, 64)
    with CheckpointSaver(run="r", run_dir=tmp_path / "run", store=store, settings=_fast()) as saver:
        for step in range(1, 5):
            w.fill_(float(step))
            saver.save(step=step, model_state={"w": w}, optim_state={"m": w * 2})
            w.fill_(-1.0)  # changed right after save() returns
            assert saver.wait(60)
        assert saver._queue.pool.spare_bytes() > 0  # the buffers of a finished save wait for the next one
    for step in range(1, 5):
        loaded = load_checkpoint(schema.store_key("r", schema.checkpoint_dir(step)), store)
        assert torch.equal(loaded.model_state["w"], torch.full((64, 64), float(step)))
        assert torch.equal(loaded.optim_state["m"], torch.full((64, 64), 2.0 * step))


@pytest.mark.s3
def test_wrong_credentials_fail_the_save_at_once_and_say_so(
    s3_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", uuid.uuid4().hex)
    store = S3Store(bucket=s3_env["LONGRUN_BUCKET"], endpoint_url=s3_env["AWS_ENDPOINT_URL"])
    model, _ = tiny_state(4)
    with CheckpointSaver(run="creds", run_dir=tmp_path, store=store, settings=_fast(retry=60)) as saver:
        saver.save(step=1, model_state=model)
        assert saver.wait(120)
    error = saver.results[0].error or ""
    assert "StoreAuthError" in error and "AWS_SECRET_ACCESS_KEY" in error, error
    # Terminal: raised at the first attempt, not retried until the 60 s deadline ("gave up after N").
    assert "gave up after" not in error, error


class _WrappedStore:
    """A store the saver cannot rebuild in another process (no store_spec): uploads stay in the thread."""

    def __init__(self, inner: LocalDirStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_a_store_without_a_spec_uploads_from_the_writer_thread(tmp_path: Path) -> None:
    inner = LocalDirStore(tmp_path / "store")
    store = _WrappedStore(inner)
    model, _ = tiny_state(5)
    with CheckpointSaver(run="w", run_dir=tmp_path / "run", store=store) as saver:  # type: ignore[arg-type]
        assert saver.writer == "thread"
        saver.save(step=2, model_state=model)
    assert saver.results[0].ok and saver.results[0].uploaded
    assert load_checkpoint(schema.store_key("w", schema.checkpoint_dir(2)), inner).step == 2


def test_background_work_runs_at_a_lower_priority(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "store")
    settings = SaverSettings(writer="thread", background_nice=5, wait_timeout_s=60)
    with CheckpointSaver(run="n", run_dir=tmp_path / "run", store=store, settings=settings) as saver:
        saver.save(step=1, model_state={"w": torch.zeros(2)})
        assert saver.wait(60)
        tid = saver._thread.native_id
        assert tid is not None
        assert os.getpriority(os.PRIO_PROCESS, tid) >= os.getpriority(os.PRIO_PROCESS, 0) + 5
    with pytest.raises(ValueError, match="background_nice"):
        SaverSettings(background_nice=40)
