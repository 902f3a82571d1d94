"""An alert seen locally is never lost to an upload error (issue 10 item 8).

The alert is fsynced in the run dir first; its upload then keeps trying through a store outage (bounded,
under the verdict barrier's timeout), is spooled if the store is still away, and retried at close. Before:
four tries over ~3.5 s, then the alert lived only on the node and the orchestrator never saw it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from training import events
from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import ObjectInfo, StoreUnavailable
from training.store.local import LocalDirStore


class Outage(LocalDirStore):
    """A local store that is unreachable while `down` is set (what a network partition looks like)."""

    down = True

    def put_bytes(self, key: str, data: bytes, **kw: Any) -> ObjectInfo:
        if self.down:
            raise StoreUnavailable(f"put {key}: cannot reach the store (test outage)")
        return super().put_bytes(key, data, **kw)


def _alert(run: str) -> dict[str, Any]:
    return schema.record(
        "alert", run=run, step=9, check="recompute", suspect_ranks=[1], suspect_nodes=["n2"], evidence={}
    )


def _writer(run: str, tmp_path: Path, store: Any) -> events.EventWriter:
    return events.EventWriter(
        run=run, run_dir=tmp_path / "run", store=store, rank=1, flush_every=10, progress_interval_s=1.0
    )


def _alerts_in(store: Any, run: str) -> list[str]:
    return [o.key for o in store.list(schema.store_key(run, "alerts/"))]


def test_an_alert_written_during_an_outage_is_spooled_and_sent_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "ALERT_UPLOAD_DEADLINE_S", 1.0)
    store = Outage(tmp_path / "store")
    writer = _writer("spool", tmp_path, store)
    path = writer.alert(_alert("spool"))
    assert path.exists() and not _alerts_in(store, "spool")
    store.down = False  # the store comes back before the process ends
    writer.close()
    assert len(_alerts_in(store, "spool")) == 1


def test_an_alert_rides_out_a_short_outage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Outage(tmp_path / "store")
    writer = _writer("ride", tmp_path, store)
    threading.Timer(6.0, lambda: setattr(store, "down", False)).start()  # longer than the old ~3.5 s
    writer.alert(_alert("ride"))
    assert len(_alerts_in(store, "ride")) == 1
    writer.close()


@pytest.mark.s3
@pytest.mark.slow
def test_an_alert_reaches_seaweedfs_after_it_was_stopped(
    local_stack, s3_store_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in s3_store_env.items():
        monkeypatch.setenv(k, v)
    run = f"spool-{int(time.time())}"
    store = store_from_env()
    said: list[str] = []
    local_stack.s3.down(said.append)
    try:
        writer = _writer(run, tmp_path, store)
        threading.Timer(5.0, lambda: local_stack.s3.up(said.append)).start()
        writer.alert(_alert(run))
        writer.close()
    finally:
        deadline = time.monotonic() + 60
        while not local_stack.s3.all_alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        if not local_stack.s3.all_alive():
            local_stack.s3.up(said.append)
    assert len(_alerts_in(store, run)) == 1, said
