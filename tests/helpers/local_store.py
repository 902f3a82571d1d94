"""A test's store as a local directory only: the S3 and orchestrator-side settings of the session are
removed from the environment, so code that builds its store from the environment finds this one."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.store.local import LocalDirStore


def use_local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalDirStore:
    monkeypatch.setenv("LONGRUN_STORE_DIR", str(tmp_path / "store"))
    for k in ("AWS_ENDPOINT_URL", "LONGRUN_BUCKET", "LONGRUN_ORCH_STORE_DIR"):
        monkeypatch.delenv(k, raising=False)
    return LocalDirStore(tmp_path / "store")
