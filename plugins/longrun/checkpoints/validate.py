"""Validate a stored checkpoint and write a validation record; the checkpoint itself is never modified.

A checkpoint passes when: its manifest parses; every file it lists is present with the listed size and
SHA-256; each loads with `torch.load(weights_only=True)`; no tensor holds NaN or Inf; and the per-tensor
fingerprints recomputed from the stored model weights equal the manifest's (the weight-vote majority at
save time). Every error names the file and what failed.

A sharded checkpoint (the record says `format: "dcp-v1"`) is checked by
`training.checkpoint.sharded_verify.check_sharded_payload` instead: the folder whole, the record equal to
its sharded-manifest, every tensor finite, and each rank's shards recomputed from the full tensors equal to
the fingerprints the record keeps for that rank; errors name the file, or the rank and the tensor.
"""

from __future__ import annotations

import math
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from training.checkpoint.manifest import MODEL_FILE, SHARDED_FORMAT, CheckpointError, read_manifest
from training.checkpoint.sharded_verify import check_sharded_payload
from training.fingerprint.host import combine, fingerprint_state
from training.records import schema
from training.store.interface import NotFound, ObjectStore, put_json, sha256_file


def _tensors(obj: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield path or "<root>", obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _tensors(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{path}[{i}]")


def _nonfinite(obj: Any) -> list[str]:
    bad = []
    for name, t in _tensors(obj):
        if (t.is_floating_point() or t.is_complex()) and t.numel():
            n = int((~torch.isfinite(t)).sum())
            if n:
                bad.append(f"{name}: {n} of {t.numel()} values are NaN/Inf")
    return bad


def _check_files(
    directory: Path, manifest: Mapping[str, Any], errors: list[str], stats: dict[str, int]
) -> dict[str, Any]:
    """Check each file the manifest lists (present, size, sha256, loads with weights_only, finite), adding
    to `errors` and `stats`; the objects of the files that loaded, by name."""
    loaded: dict[str, Any] = {}
    for f in manifest["files"]:
        name = f["name"]
        path = directory / name
        if not path.is_file():
            errors.append(f"{name}: missing")
            continue
        size = path.stat().st_size
        stats["files"] += 1
        stats["bytes"] += size
        if size != f["size"]:
            errors.append(f"{name}: size {size} bytes, manifest says {f['size']}")
            continue
        digest = sha256_file(path)
        if digest != f["sha256"]:
            errors.append(f"{name}: sha256 {digest} does not match the manifest's {f['sha256']}")
            continue
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            errors.append(
                f"{name}: does not load with torch.load(weights_only=True): {type(e).__name__}: {e}"
            )
            continue
        loaded[name] = obj
        stats["tensors"] += sum(1 for _ in _tensors(obj))
        errors.extend(f"{name}: {b}" for b in _nonfinite(obj))
    return loaded


def _check_fingerprints(
    model: Mapping[str, Any],
    want: Mapping[str, Any],
    manifest: Mapping[str, Any],
    errors: list[str],
    warnings: list[str],
) -> None:
    """Check the model's tensors against the manifest's fingerprints (`want`: per tensor, and combined
    when no error was found so far), adding to `errors` and `warnings`."""
    got = fingerprint_state(model)
    for tname in sorted(want):
        if tname not in got:
            errors.append(
                f"{MODEL_FILE}: tensor {tname!r} is in the manifest's fingerprints, not in the file"
            )
        elif got[tname] != want[tname]:
            errors.append(
                f"{MODEL_FILE}: tensor {tname!r} fingerprint {got[tname]} != manifest {want[tname]}"
                " (the weight-vote majority at save time)"
            )
    uncovered = sorted(set(got) - set(want))
    if uncovered:
        warnings.append(f"{MODEL_FILE}: tensors without a manifest fingerprint: {uncovered[:10]}")
    combined = manifest.get("fingerprint")
    if isinstance(combined, str) and not errors and combine({n: got[n] for n in want}) != combined:
        errors.append(f"{MODEL_FILE}: combined fingerprint != manifest 'fingerprint' {combined}")


def check_payload(
    directory: Path, manifest: Mapping[str, Any]
) -> tuple[list[str], list[str], dict[str, int]]:
    """Check downloaded files against `manifest`: (errors, warnings, stats). Pure: reads `directory` only.
    A sharded checkpoint (`format: dcp-v1`) is checked by `training.checkpoint.sharded_verify`."""
    if manifest.get("format") == SHARDED_FORMAT:
        errors, warnings, stats = check_sharded_payload(directory, manifest)
    else:
        errors, warnings, stats = _check_unsharded(directory, manifest)
    loss = manifest.get("loss")
    if isinstance(loss, float) and not math.isfinite(loss):
        errors.append(f"manifest.json: the loss at save time is {loss}")
    return errors, warnings, stats


def _check_unsharded(
    directory: Path, manifest: Mapping[str, Any]
) -> tuple[list[str], list[str], dict[str, int]]:
    errors: list[str] = []
    warnings: list[str] = []
    stats = {"files": 0, "bytes": 0, "tensors": 0}
    loaded = _check_files(directory, manifest, errors, stats)

    want = manifest.get("fingerprints") or {}
    if not want:
        errors.append("manifest.json: no tensor fingerprints to check the weights against")
    elif MODEL_FILE in loaded:
        model = loaded[MODEL_FILE]
        if not isinstance(model, Mapping):
            errors.append(f"{MODEL_FILE}: expected a state dict, found {type(model).__name__}")
        else:
            _check_fingerprints(model, want, manifest, errors, warnings)
    elif not any(f["name"] == MODEL_FILE for f in manifest["files"]):
        errors.append(f"manifest.json: lists no {MODEL_FILE}, so the fingerprints cannot be checked")
    return errors, warnings, stats


def validate(store: ObjectStore, run: str, step: int, *, write: bool = True) -> dict[str, Any]:
    """Validate checkpoint `step` of `run` and (with `write`) store the validation record; returns it."""
    t0 = time.perf_counter()
    manifest_key = schema.store_key(run, schema.manifest_path(step))
    prefix = manifest_key.rsplit("/", 1)[0] + "/"
    errors: list[str] = []
    warnings: list[str] = []
    stats: dict[str, int] = {"files": 0, "bytes": 0, "tensors": 0}
    manifest_info = store.head(manifest_key)
    if manifest_info is None:
        errors.append(f"manifest.json: missing at {manifest_key}: not a (complete) checkpoint")
    else:
        try:
            manifest = read_manifest(store.get_bytes(manifest_key), manifest_key)
            if manifest["run"] != run or manifest["step"] != step:
                raise CheckpointError(
                    f"manifest {manifest_key} says run {manifest['run']!r} step {manifest['step']}"
                )
        except NotFound:
            errors.append(f"manifest.json: vanished at {manifest_key}")
        except CheckpointError as e:
            errors.append(f"manifest.json: {e}")
        else:
            with tempfile.TemporaryDirectory(prefix="longrun-validate-") as tmp:
                for f in manifest["files"]:
                    try:
                        store.download(prefix + f["name"], Path(tmp) / f["name"])
                    except NotFound:
                        pass  # check_payload reports it as missing
                errors, warnings, stats = check_payload(Path(tmp), manifest)
    ident = f"{int(time.time())}-{uuid.uuid4().hex[:8]}"
    rec = schema.record(
        "validation",
        run=run,
        step=step,
        ok=not errors,
        errors=errors,
        warnings=warnings,
        validation_id=ident,
        manifest_key=manifest_key,
        manifest_etag=manifest_info.etag if manifest_info else None,
        duration_s=round(time.perf_counter() - t0, 6),
        **stats,
    )
    if write:
        put_json(store, schema.store_key(run, schema.validation_path(step, ident)), rec, if_none_match=True)
    return rec
