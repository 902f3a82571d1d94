"""Fixtures for the checkpoint tests: one `store` fixture, run against both implementations.

`local`: a LocalDirStore in a temporary directory. `s3`: SeaweedFS from the session's local stack (the
`s3_store_env` fixture) with its generated identity; the credentials go into this process's environment
for the test, because the saver's NVRx worker process rebuilds the store from it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from training.s3_store import S3Store
from training.store import LocalDirStore, ObjectStore

STORE_KINDS = ["local", pytest.param("s3", marks=pytest.mark.s3)]


@pytest.fixture
def s3_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env: dict[str, str] = request.getfixturevalue("s3_store_env")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalDirStore(tmp_path / "store")
    env = request.getfixturevalue("s3_env")
    # A small multipart threshold so the contract tests exercise multipart uploads with small files.
    return S3Store(
        bucket=env["LONGRUN_BUCKET"], endpoint_url=env["AWS_ENDPOINT_URL"], multipart_threshold=5 << 20
    )


@pytest.fixture
def run() -> str:
    """A run name of its own per test, so tests sharing the session's bucket never see each other."""
    return f"t-{uuid.uuid4().hex[:10]}"
