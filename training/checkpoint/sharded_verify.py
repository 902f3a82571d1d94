"""Validation of a sharded (`dcp-v1`) checkpoint without a process group: what the orchestrator runs on a
downloaded copy (longrun.checkpoints.validate branches here on the record's `format`), and what
`training.checkpoint.sharded_store.fetch_sharded` uses to hold the record to the folder.

    errors, warnings, stats = check_sharded_payload(folder, record)     # record: the manifest.json record

A sharded checkpoint passes when:

1. the folder is whole (`validate_sharded`: every file the sharded-manifest lists is present with its size
   and SHA-256, every rank's file and `.metadata` are listed, nothing else is there), each problem naming
   its file;
2. the store's record agrees with the folder's `sharded-manifest.json`: the same files with the same sizes
   and SHA-256 (and the sharded-manifest's own), and the same `world_size`, `mesh` and
   `shard_fingerprints` (`manifest.json: ...` errors);
3. every tensor loads (DCP's reader, `no_dist=True`, into tensors preallocated from `.metadata`) and none
   holds NaN or Inf (`__3_0.distcp: model.0.weight: 2 of 48 values are NaN/Inf`, naming the rank file of
   the shard that holds them); rank 0's `extra.pt` loads with `weights_only=True` and is finite too;
4. each rank's local model shards, RECOMPUTED from the loaded full tensors and the mesh, have the
   fingerprints the record says that rank held at save time (`rank 3: tensor '0.weight': ...`). FSDP2
   shards dim 0 over the mesh's "shard" dimension with `torch.chunk` semantics (a rank past the last chunk
   holds an empty shard); ranks along "replicate" hold the same shard; the ranks are laid on the mesh in
   row-major order, as `init_device_mesh` lays them. A tensor that `.metadata` stores as one chunk covering
   all of it is replicated (a buffer, or a parameter on a one-wide shard dimension): every rank holds it
   whole. This is what catches shards whose bytes were rewritten and re-hashed: the files agree with the
   manifest, the values do not agree with what the ranks held.

Nothing is unpickled without an allowlist: `.metadata` is a pickle (DCP reads it with a plain
`pickle.load`), so it is read here by an unpickler that only resolves DCP's metadata classes, torch dtypes
and layouts (torch's own weights-only unpickler does not read the pickle protocol DCP writes); tensors are
read by DCP with `torch.load(weights_only=True)`, and the non-tensor entries of the optimizer state
(pickled objects, which DCP would read with `weights_only=False`) are never read.
"""

from __future__ import annotations

import io
import math
import pathlib
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from training.checkpoint.manifest import DCP_METADATA, CheckpointError
from training.checkpoint.sharded import EXTRA, MANIFEST, read_sharded_manifest, validate_sharded
from training.fingerprint.host import fingerprint_state
from training.store.interface import sha256_file

#: The mesh dimension FSDP2 shards over (HSDP: the other is "replicate").
SHARD_DIM = "shard"
#: The prefix `save_sharded` gives the model's entries in DCP's state dict.
MODEL_PREFIX = "model."


def _enum_member(cls: Any, name: Any) -> Any:
    """`getattr(cls, name)` for a member of DCP's `_MEM_FORMAT_ENCODING` only (see `_MetadataUnpickler`)."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    if cls is not _MEM_FORMAT_ENCODING or not isinstance(name, str) or name not in cls.__members__:
        raise pickle.UnpicklingError(f"{DCP_METADATA}: getattr({cls!r}, {name!r}) is not a DCP enum member")
    return cls.__members__[name]


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only what DCP's `.metadata` holds: its metadata classes, torch dtypes, Size and layouts."""

    def find_class(self, module: str, name: str) -> Any:
        from torch.distributed.checkpoint import metadata as md
        from torch.distributed.checkpoint.filesystem import _StorageInfo

        allowed: dict[tuple[str, str], Any] = {
            ("torch", "Size"): torch.Size,
            ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
            ("pathlib", "PosixPath"): pathlib.PosixPath,
            ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
        }
        for cls in (
            md.Metadata,
            md.MetadataIndex,
            md.StorageMeta,
            md.TensorProperties,
            md.TensorStorageMetadata,
            md.ChunkStorageMetadata,
            md.BytesStorageMetadata,
            md._MEM_FORMAT_ENCODING,
        ):
            allowed[(cls.__module__, cls.__qualname__)] = cls
        if (module, name) in allowed:
            return allowed[(module, name)]
        if (module, name) == ("builtins", "getattr"):
            # Python 3.11 pickles an enum member as getattr(<enum class>, "<member>"): allowed for the
            # allowlisted enum's members only; any other getattr could reach a callable and run it.
            return _enum_member
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{DCP_METADATA}: refers to {module}.{name}, not a DCP metadata class")


def read_dcp_metadata(folder: str | Path) -> Any:
    """DCP's `Metadata` of the checkpoint in `folder`, unpickled through an allowlist (see the module
    docstring); CheckpointError naming the file when it does not read."""
    path = Path(folder) / DCP_METADATA
    try:
        meta = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except Exception as e:
        raise CheckpointError(f"{DCP_METADATA}: does not read: {type(e).__name__}: {e}") from None
    if not hasattr(meta, "state_dict_metadata") or not hasattr(meta, "storage_data"):
        raise CheckpointError(f"{DCP_METADATA}: holds a {type(meta).__name__}, not DCP metadata")
    return meta


def record_agrees(record: Mapping[str, Any], folder: str | Path) -> list[str]:
    """Every way the store's record (`manifest.json`) disagrees with the folder's sharded-manifest: its file
    list, sizes and SHA-256 (the sharded-manifest's own included), world size, mesh, shard fingerprints."""
    folder = Path(folder)
    sharded = read_sharded_manifest(folder)
    errors = []
    want = {f["name"]: f for f in sharded["files"]}
    have = {f["name"]: f for f in record.get("files") or [] if isinstance(f, Mapping)}
    for name in sorted(set(want) - set(have)):
        errors.append(f"manifest.json: does not list {name}, which {MANIFEST} lists")
    for name in sorted(set(have) - set(want) - {MANIFEST}):
        errors.append(f"manifest.json: lists {name}, which {MANIFEST} does not")
    for name in sorted(set(want) & set(have)):
        if (have[name].get("size"), have[name].get("sha256")) != (want[name]["size"], want[name]["sha256"]):
            errors.append(f"manifest.json: {name}: size or SHA-256 differs from {MANIFEST}'s")
    own = have.get(MANIFEST)
    if own is None:
        errors.append(f"manifest.json: does not list {MANIFEST}")
    elif (own.get("size"), own.get("sha256")) != (
        (folder / MANIFEST).stat().st_size,
        sha256_file(folder / MANIFEST),
    ):
        errors.append(f"manifest.json: {MANIFEST}: size or SHA-256 differs from the file's")
    for field in ("world_size", "mesh"):
        if record.get(field) != sharded.get(field):
            errors.append(
                f"manifest.json: {field} {record.get(field)!r} != {MANIFEST}'s {sharded.get(field)!r}"
            )
    theirs = sharded.get("shard_fingerprints") or {}
    ours = record.get("shard_fingerprints")
    ours = ours if isinstance(ours, Mapping) else {}
    for rank in sorted(set(theirs) | set(ours), key=lambda r: (len(str(r)), str(r))):
        a, b = ours.get(rank) or {}, theirs.get(rank) or {}
        for tensor in sorted(set(a) | set(b)):
            if a.get(tensor) != b.get(tensor):
                errors.append(
                    f"manifest.json: rank {rank}: tensor {tensor!r}: shard fingerprint {a.get(tensor)} !="
                    f" {MANIFEST}'s {b.get(tensor)}"
                )
    return errors


def load_full_tensors(folder: str | Path, meta: Any) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, whole, by DCP's name (`model.0.weight`, `optim.state...`): tensors
    preallocated from `.metadata`, filled by DCP's reader without a process group. Non-tensor entries are
    not read. CheckpointError when a tensor's chunks do not cover it or DCP fails."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    state: dict[str, torch.Tensor] = {}
    for fqn, md in meta.state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata):
            continue
        covered = sum(math.prod(c.sizes) for c in md.chunks)
        if covered != math.prod(md.size):
            raise CheckpointError(
                f"{DCP_METADATA}: tensor {fqn!r}: its chunks hold {covered} of {math.prod(md.size)} values"
            )
        state[fqn] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    reader = dcp.FileSystemReader(str(folder))
    reader.read_metadata = lambda *a, **k: meta  # type: ignore[method-assign]  # never DCP's pickle.load
    try:
        with warnings.catch_warnings():  # no process group is the point here, not a mistake
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load(state, storage_reader=reader, no_dist=True)
    except Exception as e:
        raise CheckpointError(f"the DCP shards do not load: {type(e).__name__}: {e}") from None
    return state


def _nonfinite(t: torch.Tensor) -> int:
    if not (t.is_floating_point() or t.is_complex()) or not t.numel():
        return 0
    return int((~torch.isfinite(t)).sum())


def nonfinite_report(tensors: Mapping[str, torch.Tensor], meta: Any) -> list[str]:
    """`<rank file>: <tensor>: n of m values are NaN/Inf`, one per stored chunk that holds any."""
    files: dict[tuple[str, tuple[int, ...]], str] = {}
    for index, info in meta.storage_data.items():
        if index.offset is not None:
            files[(index.fqn, tuple(index.offset))] = info.relative_path
    out = []
    for fqn, full in tensors.items():
        if not _nonfinite(full):
            continue
        for chunk in meta.state_dict_metadata[fqn].chunks:
            part = full
            for dim, (off, size) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
                part = part.narrow(dim, off, size)
            n = _nonfinite(part)
            if n:
                where = files.get((fqn, tuple(chunk.offsets)), "a rank file")
                out.append(f"{where}: {fqn}: {n} of {part.numel()} values are NaN/Inf")
    return out


def shard_coordinates(mesh: Mapping[str, Any], world_size: int) -> list[tuple[int, int]]:
    """Per rank: (its index along the shard dimension, how many shards there are). CheckpointError when
    the mesh does not fit the world or names no shard dimension."""
    dims, shape = list(mesh.get("dims") or []), [int(s) for s in mesh.get("shape") or []]
    if not shape or math.prod(shape) != world_size:
        raise CheckpointError(f"mesh {dict(mesh)} does not hold a world of {world_size} ranks")
    if SHARD_DIM in dims:
        axis = dims.index(SHARD_DIM)
    elif len(shape) == 1:
        axis = 0
    else:
        raise CheckpointError(f"mesh {dict(mesh)} names no {SHARD_DIM!r} dimension: which one shards?")
    out = []
    for rank in range(world_size):
        coords = []
        rest = rank
        for size in reversed(shape):
            coords.append(rest % size)
            rest //= size
        coords.reverse()
        out.append((coords[axis], shape[axis]))
    return out


def local_shard(full: torch.Tensor, index: int, count: int, replicated: bool) -> torch.Tensor:
    """What a rank at shard `index` of `count` held of `full` under FSDP2: `torch.chunk` along dim 0 (an
    empty tensor past the last chunk), or the whole tensor when it is replicated."""
    if replicated or full.dim() == 0:
        return full
    chunks = torch.chunk(full, count, dim=0)
    return chunks[index] if index < len(chunks) else full.new_empty((0, *full.shape[1:]))


def recompute_shard_fingerprints(
    tensors: Mapping[str, torch.Tensor], meta: Any, mesh: Mapping[str, Any], world_size: int
) -> dict[str, dict[str, str]]:
    """Per rank (as a string, like the manifest's keys), the fingerprints of that rank's local model
    shards, recomputed from the full tensors: what `fingerprint_state(local_state(model.state_dict()))`
    gave on that rank at save time."""
    coords = shard_coordinates(mesh, world_size)
    out: dict[str, dict[str, str]] = {}
    for rank, (index, count) in enumerate(coords):
        local = {}
        for fqn, full in tensors.items():
            if not fqn.startswith(MODEL_PREFIX):
                continue
            chunks = meta.state_dict_metadata[fqn].chunks
            whole = len(chunks) == 1 and tuple(chunks[0].sizes) == tuple(full.shape)
            local[fqn[len(MODEL_PREFIX) :]] = local_shard(full, index, count, replicated=whole)
        out[str(rank)] = fingerprint_state(local)
    return out


def _compare_shards(want: Any, got: Mapping[str, Mapping[str, str]]) -> list[str]:
    if not isinstance(want, Mapping) or not want:
        return ["manifest.json: no shard_fingerprints to check the shards against"]
    errors = []
    for rank in sorted(set(want) | set(got), key=lambda r: (len(str(r)), str(r))):
        if rank not in got:
            errors.append(f"manifest.json: rank {rank} has shard fingerprints, the mesh has no such rank")
            continue
        mine = want.get(rank)
        mine = mine if isinstance(mine, Mapping) else {}
        for tensor in sorted(set(mine) | set(got[rank])):
            w, g = mine.get(tensor), got[rank].get(tensor)
            if g is None:
                errors.append(
                    f"rank {rank}: tensor {tensor!r} is in the manifest's shard fingerprints, not in the checkpoint"
                )
            elif w is None:
                errors.append(f"rank {rank}: tensor {tensor!r} has no shard fingerprint in the manifest")
            elif w != g:
                errors.append(
                    f"rank {rank}: tensor {tensor!r}: shard recomputed from the checkpoint has fingerprint {g},"
                    f" the manifest says {w} (what the rank held at save time)"
                )
    return errors


def check_sharded_payload(
    directory: Path, record: Mapping[str, Any]
) -> tuple[list[str], list[str], dict[str, int]]:
    """Check a downloaded sharded checkpoint against its store record: (errors, warnings, stats), as
    `longrun.checkpoints.validate.check_payload` returns them. Pure: reads `directory` only."""
    errors: list[str] = []
    warnings: list[str] = []
    listed = [f for f in record.get("files") or [] if isinstance(f, Mapping)]
    present = [directory / f["name"] for f in listed if (directory / f["name"]).is_file()]
    stats = {"files": len(present), "bytes": sum(p.stat().st_size for p in present), "tensors": 0}
    problems = validate_sharded(directory)
    errors.extend(p.replace(f" {directory}", " the checkpoint folder") for p in problems)
    if problems:
        return errors, warnings, stats  # not whole: nothing in it is loaded
    try:
        errors.extend(record_agrees(record, directory))
        sharded = read_sharded_manifest(directory)
        meta = read_dcp_metadata(directory)
        tensors = load_full_tensors(directory, meta)
        stats["tensors"] = len(tensors)
        errors.extend(nonfinite_report(tensors, meta))
        if EXTRA in {f["name"] for f in sharded["files"]}:
            errors.extend(_check_extra(directory / EXTRA))
        got = recompute_shard_fingerprints(tensors, meta, sharded["mesh"], sharded["world_size"])
    except CheckpointError as e:
        errors.append(str(e))
        return errors, warnings, stats
    except (KeyError, TypeError, ValueError) as e:  # a sharded-manifest of the wrong shape: reported
        errors.append(f"{MANIFEST}: cannot be checked: {type(e).__name__}: {e}")
        return errors, warnings, stats
    errors.extend(_compare_shards(record.get("shard_fingerprints"), got))
    if record.get("fingerprints"):
        warnings.append(
            "manifest.json: fingerprints (whole tensors) are not checked for a dcp-v1 checkpoint;"
            " shard_fingerprints are"
        )
    return errors, warnings, stats


def _check_extra(path: Path) -> list[str]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        return [f"{EXTRA}: does not load with torch.load(weights_only=True): {type(e).__name__}: {e}"]
    bad = []
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        name, o = stack.pop()
        if isinstance(o, torch.Tensor):
            if n := _nonfinite(o):
                bad.append(f"{EXTRA}: {name or '<root>'}: {n} of {o.numel()} values are NaN/Inf")
        elif isinstance(o, Mapping):
            stack.extend((f"{name}.{k}" if name else str(k), v) for k, v in o.items())
        elif isinstance(o, list | tuple):
            stack.extend((f"{name}[{i}]", v) for i, v in enumerate(o))
    return sorted(bad)
