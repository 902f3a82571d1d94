"""Sharded (`dcp-v1`) checkpoints in the store: the upload after a sharded save, and the fetch before a
sharded resume. See docs/checkpoints.md, "Sharded checkpoints".

    # every rank: save_sharded(folder, model, optim, step=..., mesh=mesh), then on rank 0 only:
    record = upload_sharded(store, run=run, step=step, folder=folder, manifest_fields={...})
    # resume, rank 0 only:
    fetch_sharded(store, schema.store_key(run, schema.checkpoint_dir(step)), dest)
    # then every rank: load_sharded(dest, model, optim, mesh=mesh)

The store layout is the unsharded one (`runs/<run>/checkpoints/step-XXXXXXXX/`): every file the folder's
`sharded-manifest.json` lists (DCP's `.metadata`, one `__<rank>_0.distcp` per rank, rank 0's `extra.pt`),
the sharded-manifest itself, then the `manifest.json` record LAST with `If-None-Match: *`, by the same
code as an unsharded upload (`training.checkpoint.upload.publish_checkpoint`). The record is an ordinary
`manifest` record (its `files` list every object above, with size and SHA-256) plus `format: "dcp-v1"`,
`world_size`, `mesh` and `shard_fingerprints` copied from the sharded-manifest, so the record alone says
what the shards must be; the orchestrator's validation branches on `format`
(`training.checkpoint.sharded_verify`).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.checkpoint.manifest import MANIFEST_FILE, SHARDED_FORMAT, CheckpointError, read_manifest
from training.checkpoint.sharded import MANIFEST, read_sharded_manifest, validate_sharded
from training.checkpoint.sharded_verify import record_agrees
from training.checkpoint.upload import publish_checkpoint, with_retries
from training.records import schema
from training.records.job import Manifest
from training.store.interface import NotFound, ObjectStore, StoreError, dump_json, sha256_file

log = logging.getLogger(__name__)

#: What the record copies from the sharded-manifest (they say what the shards must be).
COPIED = ("world_size", "mesh", "shard_fingerprints")


def _record_files(folder: Path, rel_dir: str) -> list[dict[str, Any]]:
    """The record's `files`: each file the sharded-manifest lists (its size and SHA-256, which
    `validate_sharded` has just re-checked against the bytes), then the sharded-manifest itself."""
    sharded = read_sharded_manifest(folder)
    files = [
        {"name": f["name"], "key": rel_dir + f["name"], "size": f["size"], "sha256": f["sha256"]}
        for f in sorted(sharded["files"], key=lambda f: f["name"])
    ]
    path = folder / MANIFEST
    files.append(
        {
            "name": MANIFEST,
            "key": rel_dir + MANIFEST,
            "size": path.stat().st_size,
            "sha256": sha256_file(path),
        }
    )
    return files


def sharded_record(
    *, run: str, step: int, folder: Path, manifest_fields: Mapping[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the `manifest` record of the sharded checkpoint in `folder`, its file entries). CheckpointError
    when the folder is not whole or is of another step."""
    problems = validate_sharded(folder)
    if problems:
        raise CheckpointError(f"{folder} is not a whole checkpoint, not uploaded: " + "; ".join(problems))
    sharded = read_sharded_manifest(folder)
    if sharded.get("step") != step:
        raise CheckpointError(f"{folder / MANIFEST} is of step {sharded.get('step')}, not {step}")
    files = _record_files(folder, schema.checkpoint_dir(step))
    fields = {**manifest_fields, "format": SHARDED_FORMAT, **{k: sharded[k] for k in COPIED}}
    record = schema.record("manifest", run=run, step=step, files=files, **fields)
    Manifest.from_json(record)  # a record the orchestrator cannot read would never be promoted
    return record, files


def upload_sharded(
    store: ObjectStore,
    *,
    run: str,
    step: int,
    folder: Path,
    manifest_fields: Mapping[str, Any],
    retry_deadline_s: float = 600.0,
) -> dict[str, Any]:
    """Upload the sharded checkpoint in `folder` (saved by `save_sharded` on every rank; call on rank 0
    after it returned) as checkpoint `step` of `run`, its `manifest.json` record last and never over a
    published one. `manifest_fields`: the record's required fields (`fingerprints`, which may be `{}`,
    `weight_vote`, `coverage`, `loss`, `code_version`, `world`). Returns the `save` record (also written
    to the store's save path once uploaded). Never raises: a folder that is not whole, a step already in
    the store or a store that stays unavailable past `retry_deadline_s` is the record's `error`, and
    nothing of a refused folder is uploaded."""
    started = time.time()
    error: str | None = None
    uploaded = False
    nbytes = 0
    try:
        folder = Path(folder)
        record, files = sharded_record(run=run, step=step, folder=folder, manifest_fields=manifest_fields)
        nbytes = sum(f["size"] for f in files)
        uploaded = publish_checkpoint(
            store,
            run=run,
            step=step,
            folder=folder,
            files=files,
            manifest=dump_json(record),
            deadline_s=retry_deadline_s,
        )
    except Exception as e:  # reported, never raised into training
        error = f"{type(e).__name__}: {e}"
        log.error("sharded checkpoint step %d of run %s not uploaded: %s", step, run, error)
    result = schema.record(
        "save",
        run=run,
        step=step,
        ok=error is None,
        error=error,
        job_id=f"sharded-{uuid.uuid4().hex[:12]}",
        uploaded=uploaded,
        nbytes=nbytes,
        writer="sharded",
        duration_s=time.time() - started,
    )
    if uploaded:
        try:  # best effort, as for an unsharded save: the returned record is the caller's
            store.put_bytes(schema.store_key(run, schema.save_path(step)), dump_json(result))
        except StoreError as e:
            log.warning("save record for step %d not uploaded: %s", step, e)
    return result


def fetch_sharded(
    store: ObjectStore, key_prefix: str, dest: Path, *, retry_deadline_s: float = 120.0
) -> Path:
    """Download the sharded checkpoint at `key_prefix` (`runs/<run>/checkpoints/step-XXXXXXXX/`) into
    `dest` (created; it must be absent or empty) and return `dest`, whole: every file its record lists,
    checked by `validate_sharded` and against the record. CheckpointError naming why otherwise: no record,
    a record that is not `dcp-v1`, a file missing from the store, a folder that is not whole."""
    prefix = key_prefix.rstrip("/") + "/"
    where = f"{prefix}{MANIFEST_FILE} in {store.describe()}"
    try:
        data = with_retries(
            lambda: store.get_bytes(prefix + MANIFEST_FILE), what=f"get {where}", deadline_s=retry_deadline_s
        )
    except NotFound:
        raise CheckpointError(f"{where}: not found, so not a (complete) checkpoint") from None
    record = read_manifest(data, where)
    if record.get("format") != SHARDED_FORMAT:
        raise CheckpointError(
            f"{where}: format {record.get('format')!r}, not a sharded ({SHARDED_FORMAT}) checkpoint:"
            " load it with training.checkpoint.load.load_checkpoint"
        )
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise CheckpointError(
            f"{dest}: exists and is not an empty folder; the checkpoint is not fetched into it"
        )
    dest.mkdir(parents=True, exist_ok=True)
    for f in record["files"]:
        key = prefix + f["name"]
        try:
            with_retries(
                functools.partial(store.download, key, dest / f["name"]),
                what=f"download {key}",
                deadline_s=retry_deadline_s,
            )
        except NotFound:
            raise CheckpointError(f"{key}: listed in {where}, missing from the store") from None
    problems = validate_sharded(dest)
    if not problems:
        problems = record_agrees(record, dest)
    if problems:
        raise CheckpointError(f"{prefix} fetched into {dest} is not whole: " + "; ".join(problems))
    return dest
