"""Fixtures for the checkpoint tests: one `store` fixture, run against both implementations.

`local`: a LocalDirStore in a temporary directory. `s3`: SeaweedFS from the session's local stack (the
`s3_store_env` fixture) with its generated identity; the credentials go into this process's environment
for the test, because the saver's NVRx worker process rebuilds the store from it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import Saver, tiny_state

from training.checkpoint.saver import CheckpointSaver
from training.checkpoint.settings import SaverSettings
from training.store.interface import ObjectStore
from training.store.local import LocalDirStore
from training.store.s3 import S3Store

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


@pytest.fixture
def save_checkpoints(tmp_path: Path) -> Saver:
    """save_checkpoints(store, run, steps, coverage=..., fields=...) -> {step: model_state}: real saves
    through CheckpointSaver (writer thread, fast), waited for."""

    def save(
        store: ObjectStore,
        run: str,
        steps: list[int],
        *,
        coverage: Callable[[int], dict[str, int]] | None = None,
        fields: Callable[[int, dict[str, torch.Tensor]], dict[str, Any]] | None = None,
        writer: str = "thread",
    ) -> dict[int, dict[str, torch.Tensor]]:
        states = {}
        settings = SaverSettings(writer=writer, retry_deadline_s=10, wait_timeout_s=120)
        with CheckpointSaver(
            run=run, run_dir=tmp_path / f"run-{run}", store=store, settings=settings
        ) as saver:
            for step in steps:
                model, optim = tiny_state(step)
                extra_fields: dict[str, Any] = {
                    "coverage": coverage(step) if coverage else {},
                    "loss": 1.0 / (step + 1),
                }
                if fields:
                    extra_fields.update(fields(step, model))
                saver.save(
                    step=step,
                    model_state=model,
                    optim_state=optim,
                    extra={"rng": torch.get_rng_state()},
                    manifest_fields=extra_fields,
                )
                states[step] = model
            assert saver.wait(120), "saves did not finish"
            assert saver.last_error is None, saver.last_error
        return states

    return save
