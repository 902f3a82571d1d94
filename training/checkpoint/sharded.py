"""Sharded checkpoints: `torch.distributed.checkpoint` (DCP) files in one folder, and a manifest that lists
every file and every rank's shard fingerprints, so a partial or corrupted checkpoint is never taken for whole.

    manifest = save_sharded(folder, model, optimizer, step=..., mesh=mesh)   # every rank calls it
    pending = start_sharded_save(folder, ..., async_group=group)            # every rank: async
    pending.finish()                                                        # later; rank 0: the manifest
    problems = validate_sharded(folder)                                     # anyone, any time: [] = whole
    step = load_sharded(folder, model, optimizer, mesh=mesh)                 # every rank calls it

What is in the folder: DCP's own files (`.metadata`, written by the coordinator, and one `__<rank>_0.distcp`
per rank; DCP writes a replicated shard once, so some rank files are smaller than others) and
`sharded-manifest.json`, written last by rank 0 after every rank's files are closed: no manifest, no
checkpoint. The manifest holds, per file, its size and SHA-256; the world size and the mesh (dimension
names and shape) it was saved from; and per rank, the xxh3-64 fingerprint of each local model shard.

Validation (pure Python, no process group) refuses, naming the file: a missing manifest; a file the manifest
lists that is missing, of another size or another SHA-256; a rank file or `.metadata` that the manifest does
not list (a checkpoint saved by fewer ranks than it claims); and any file in the folder the manifest does not
know.

Loading validates first (rank 0, its verdict broadcast), then refuses a world or mesh other than the one
saved: DCP could reshard onto another mesh, but each rank's shard would then differ from the fingerprints
taken at save time, and nothing could prove the resumed weights are the saved ones. After DCP loads, every
rank compares its local shards with the manifest's fingerprints for its rank: the resume is bit-identical or
it fails, naming the rank and the tensor.

Rank 0 may add one more file, `extra.pt` (`extra_state`: what is not the model or the optimizer, such as
every rank's RNG and data-loader state, gathered to rank 0 by the caller), written before the manifest and
listed in it like DCP's files; `read_sharded_extra` reads it back with `weights_only=True`.

Status: the guard (training.api.Guard.prepare_sharded) saves and resumes through this module into the run
dir on every rank (a folder every rank must see). `training.checkpoint.sharded_store` uploads such a folder
to the store (rank 0, the `manifest.json` record last, `format: "dcp-v1"`) and fetches it back for a
resume; `training.checkpoint.sharded_verify` is the orchestrator's validation of it (docs/checkpoints.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from training.checkpoint.manifest import DCP_METADATA, SHARDED_FORMAT, CheckpointError
from training.fingerprint.host import fingerprint_state, local_state

MANIFEST = "sharded-manifest.json"
FORMAT = SHARDED_FORMAT
EXTRA = "extra.pt"
_RANK_FILE = re.compile(r"^__(\d+)_(\d+)\.distcp$")


def mesh_shape(mesh: Any) -> dict[str, Any]:
    """The mesh as the manifest records it: dimension names and shape."""
    names = list(mesh.mesh_dim_names or ())
    return {"dims": names, "shape": list(mesh.mesh.shape)}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def save_sharded(
    folder: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    mesh: Any,
    extra: Mapping[str, Any] | None = None,
    extra_state: Any = None,
) -> dict[str, Any]:
    """Save `model` and `optimizer` (sharded or not) into `folder` with DCP, then the manifest. Every rank
    calls it; every rank returns the manifest. `extra` (JSON) goes into the manifest as is; `extra_state`
    (rank 0's, anything `torch.load(weights_only=True)` reads back) into `extra.pt`, hashed and listed like
    DCP's files; other ranks' `extra_state` is ignored."""
    pending = start_sharded_save(
        folder, model, optimizer, step=step, mesh=mesh, extra=extra, extra_state=extra_state
    )
    manifest = pending.finish()  # rank 0: the manifest; the others: None
    shared: list[object] = [manifest]
    dist.broadcast_object_list(shared, src=0)
    return dict(shared[0])  # type: ignore[call-overload]


class PendingShardedSave:
    """A sharded save whose files may still be being written (`start_sharded_save`). `wait()` on every rank
    before the next save; `finish()` on rank 0 writes the manifest once every rank's files are written."""

    def __init__(
        self,
        folder: Path,
        manifest: dict[str, Any],
        written: Any,
        *,
        rank: int,
        timeout_s: float | None = None,
    ) -> None:
        self.folder, self.rank, self.timeout_s = folder, rank, timeout_s
        self._manifest = manifest
        self._written = written
        """DCP's future (async) or None (written already)."""

    def wait(self, timeout_s: float | None = None) -> None:
        """Until this rank's part is written (at most `timeout_s`, default the save's: TimeoutError after);
        raises what DCP raised (a save that failed has no manifest, so it is never taken for whole)."""
        if self._written is not None:
            self._written.result(timeout=timeout_s if timeout_s is not None else self.timeout_s)

    def finish(self) -> dict[str, Any] | None:
        """Wait, then (rank 0) hash every file and write the manifest, last and whole: no manifest, no
        checkpoint. Returns the manifest on rank 0, None on the others. On rank 0 the wait ends only once
        every rank's files are written and closed: DCP's coordinator gathers every rank's write results
        before it writes `.metadata` and completes."""
        self.wait()
        if self.rank != 0:
            return None
        manifest = dict(self._manifest)
        manifest["files"] = [
            {"name": p.name, "size": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(self.folder.iterdir())
            if p.is_file() and p.name != MANIFEST
        ]
        tmp = self.folder / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp, self.folder / MANIFEST)
        return manifest


def start_sharded_save(
    folder: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    mesh: Any,
    extra: Mapping[str, Any] | None = None,
    extra_state: Any = None,
    async_group: Any = None,
    timeout_s: float | None = None,
) -> PendingShardedSave:
    """Every rank: the part of a save that must happen now, on this step's state. Rank 0 writes
    `extra_state`; every rank fingerprints its local shards (one all-gather on the default group); then DCP
    writes the shards, synchronously, or, with `async_group` (a process group with a CPU backend, used by no
    one else), through `dcp.async_save`: the state is copied to host memory before it returns (so the next
    step may change the weights), and the files are written in a background thread whose collectives use
    `async_group`, never the training's group; `timeout_s` bounds the waits for it. See `save_sharded` for
    `extra` and `extra_state`."""
    import torch.distributed.checkpoint as dcp

    folder = Path(folder)
    if (folder / MANIFEST).exists():
        raise CheckpointError(f"{folder} already holds a checkpoint (its manifest exists): not overwritten")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0 and extra_state is not None:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(extra_state, folder / EXTRA)  # listed with DCP's files, before the manifest
    mine = fingerprint_state(local_state(model.state_dict()))
    every: list[object] = [None] * world
    dist.all_gather_object(every, mine)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "step": step,
        "world_size": world,
        "mesh": mesh_shape(mesh),
        "shard_fingerprints": {str(r): fps for r, fps in enumerate(every)},
        "extra": dict(extra or {}),
    }
    state = _state(model, optimizer)
    if async_group is None:
        dcp.save(state, checkpoint_id=str(folder))
        dist.barrier()  # every rank's files are closed once this returns
        return PendingShardedSave(folder, manifest, None, rank=rank)
    written = dcp.async_save(state, checkpoint_id=str(folder), process_group=async_group)
    return PendingShardedSave(folder, manifest, written, rank=rank, timeout_s=timeout_s)


def read_sharded_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The folder's manifest, checked for shape; CheckpointError names the folder and what is wrong."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing: the checkpoint is incomplete (the manifest is written last)"
        ) from None
    except ValueError as e:
        raise CheckpointError(f"{path} is unreadable: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a {FORMAT} manifest")
    world = manifest.get("world_size")
    files = manifest.get("files")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise CheckpointError(f"{path}: world_size = {world!r} is not a positive integer")
    if not isinstance(files, list) or not all(
        isinstance(f, dict)
        and isinstance(f.get("name"), str)
        and "/" not in f["name"]
        and f["name"] not in ("", ".", "..")
        and isinstance(f.get("size"), int)
        and isinstance(f.get("sha256"), str)
        for f in files
    ):
        raise CheckpointError(f"{path}: files is not a list of {{name, size, sha256}} entries")
    return manifest


def validate_sharded(folder: str | os.PathLike[str]) -> list[str]:
    """Every reason the checkpoint in `folder` is not whole and unchanged, each naming its file; [] when it
    is. Reads every byte (SHA-256 of each file)."""
    folder = Path(folder)
    try:
        manifest = read_sharded_manifest(folder)
    except CheckpointError as e:
        return [str(e)]
    problems = []
    listed = {f["name"]: f for f in manifest["files"]}
    for name, entry in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}: listed in the manifest, missing from {folder}")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            problems.append(f"{name}: {size} bytes, the manifest says {entry['size']}")
        elif _sha256(path) != entry["sha256"]:
            problems.append(f"{name}: SHA-256 differs from the manifest's (the file changed after the save)")
    expected = {DCP_METADATA} | {f"__{r}_0.distcp" for r in range(manifest["world_size"])}
    for name in sorted(expected - set(listed)):
        problems.append(f"{name}: not in the manifest of a {manifest['world_size']}-rank checkpoint")
    for name in sorted(set(listed) - expected - {EXTRA}):
        m = _RANK_FILE.match(name)
        if m is None or int(m.group(1)) >= manifest["world_size"]:
            problems.append(
                f"{name}: listed, but not a file of a {manifest['world_size']}-rank DCP checkpoint"
            )
    on_disk = {p.name for p in folder.iterdir() if p.is_file()} - {MANIFEST}
    for name in sorted(on_disk - set(listed)):
        problems.append(f"{name}: in {folder}, not in its manifest")
    return problems


def read_sharded_extra(folder: str | os.PathLike[str]) -> Any:
    """Rank 0's `extra_state` of the checkpoint in `folder` (None when it saved none). Call it after
    `load_sharded`, which validated the folder; it reads with `weights_only=True`."""
    path = Path(folder) / EXTRA
    listed = {f["name"] for f in read_sharded_manifest(folder)["files"]}
    if EXTRA not in listed:
        return None
    return torch.load(path, weights_only=True)


def load_sharded(
    folder: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, mesh: Any
) -> dict[str, Any]:
    """Load the checkpoint in `folder` into `model` and `optimizer` (every rank calls it) and return its
    manifest. CheckpointError, on every rank alike, when it is not whole, was saved from another world or
    mesh, or a loaded shard differs from the fingerprint saved for this rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    rank, world = dist.get_rank(), dist.get_world_size()
    verdict: list[object] = [validate_sharded(folder) if rank == 0 else None]
    dist.broadcast_object_list(verdict, src=0)
    problems = verdict[0]
    if problems:
        raise CheckpointError(f"{folder} is not a whole checkpoint: " + "; ".join(problems))  # type: ignore[arg-type]
    manifest = read_sharded_manifest(folder)
    here = mesh_shape(mesh)
    if manifest["world_size"] != world or manifest["mesh"] != here:
        raise CheckpointError(
            f"{folder} was saved by {manifest['world_size']} ranks on mesh {manifest['mesh']}; this run has"
            f" {world} ranks on mesh {here}. Resharding is refused: the shards would not compare with the"
            " fingerprints taken at save time. Resume on the same mesh (a spare node in place of a lost one)"
        )
    state = _state(model, optimizer)
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    want = manifest["shard_fingerprints"].get(str(rank), {})
    got = fingerprint_state(local_state(model.state_dict()))
    differ = sorted(n for n in set(want) | set(got) if want.get(n) != got.get(n))
    report: list[object] = [None] * world
    dist.all_gather_object(report, differ)
    bad = {r: d for r, d in enumerate(report) if d}
    if bad:
        raise CheckpointError(
            f"{folder}: after loading, these ranks' shards differ from the fingerprints saved for them: {bad}"
        )
    return manifest
