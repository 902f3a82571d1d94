"""Loading a checkpoint back: from a local checkpoint directory or a store key prefix, verified."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training.checkpoint.manifest import (
    EXTRA_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    OPTIM_FILE,
    SHARDED_FORMAT,
    CheckpointError,
    read_manifest,
)
from training.store.factory import store_from_env
from training.store.interface import NotFound, ObjectStore, sha256_file


@dataclass(slots=True, kw_only=True)
class LoadedCheckpoint:
    """A checkpoint read back by `load_checkpoint`."""

    step: int
    """Training step of the checkpoint."""
    model_state: dict[str, torch.Tensor]
    """The model's state dict."""
    optim_state: dict[str, Any]
    """The optimizer's state dict."""
    extra: dict[str, Any]
    """Whatever the trainer saved besides (RNG states, data position, ...)."""
    manifest: dict[str, Any] = field(default_factory=dict)
    """The parsed manifest."""


def _torch_load(path: Path, label: str) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{label}: torch.load(weights_only=True) failed: {e}") from None


def _unsharded(manifest: dict[str, Any], label: str) -> dict[str, Any]:
    if manifest.get("format") == SHARDED_FORMAT:
        raise CheckpointError(
            f"{label}: a sharded ({SHARDED_FORMAT}) checkpoint: fetch it with"
            " training.checkpoint.sharded_store.fetch_sharded, then load_sharded on every rank"
        )
    return manifest


def _load_dir(directory: Path, manifest: dict[str, Any], label: str, verify: bool) -> LoadedCheckpoint:
    parts: dict[str, Any] = {}
    for f in manifest["files"]:
        path = directory / f["name"]
        where = f"{label}{f['name']}"
        if not path.is_file():
            raise CheckpointError(f"{where}: file missing")
        if verify:
            size = path.stat().st_size
            if size != f["size"]:
                raise CheckpointError(f"{where}: size {size} != manifest {f['size']}")
            digest = sha256_file(path)
            if digest != f["sha256"]:
                raise CheckpointError(f"{where}: sha256 {digest} != manifest {f['sha256']}")
        parts[f["name"]] = _torch_load(path, where)
    return LoadedCheckpoint(
        step=manifest["step"],
        model_state=parts.get(MODEL_FILE, {}),
        optim_state=parts.get(OPTIM_FILE, {}),
        extra=parts.get(EXTRA_FILE, {}),
        manifest=manifest,
    )


def load_checkpoint(
    ref: str | os.PathLike[str], store: ObjectStore | None = None, *, verify: bool = True
) -> LoadedCheckpoint:
    """Load a checkpoint from a local checkpoint directory, or from a store key prefix such as
    ``runs/<run>/checkpoints/step-00000040/`` (store: `store`, else the one the environment names).
    Without a manifest there is no checkpoint. With `verify`, every file's size and SHA-256 are checked."""
    local = Path(ref)
    if local.is_dir():
        mpath = local / MANIFEST_FILE
        if not mpath.is_file():
            raise CheckpointError(f"{local}: no {MANIFEST_FILE}, so not a (complete) checkpoint")
        manifest = _unsharded(read_manifest(mpath.read_bytes(), str(mpath)), str(local))
        return _load_dir(local, manifest, f"{local}/", verify)
    prefix = str(ref).rstrip("/") + "/"
    store = store or store_from_env()
    try:
        data = store.get_bytes(prefix + MANIFEST_FILE)
    except NotFound:
        raise CheckpointError(
            f"{prefix}{MANIFEST_FILE} not found in {store.describe()}: not a (complete) checkpoint"
        ) from None
    manifest = _unsharded(read_manifest(data, f"{prefix}{MANIFEST_FILE} in {store.describe()}"), prefix)
    with tempfile.TemporaryDirectory(prefix="longrun-ckpt-") as tmp:
        for f in manifest["files"]:
            try:
                store.download(prefix + f["name"], Path(tmp) / f["name"])
            except NotFound:
                raise CheckpointError(f"{prefix}{f['name']}: missing in {store.describe()}") from None
        return _load_dir(Path(tmp), manifest, prefix, verify)
