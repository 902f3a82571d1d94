"""The upload stage of a checkpoint save: hash, local manifest, upload with retries, manifest last, record.

`run_upload_job` is a plain function of a picklable `UploadJob`, so it runs either in the saver's writer
thread or in NVRx's persistent async worker process (the two uploaders of `training.checkpoint.uploaders`). See
docs/checkpoints.md.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.checkpoint.manifest import MANIFEST_FILE
from training.records import schema
from training.store.factory import store_from_spec
from training.store.interface import (
    ObjectStore,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
    dump_json,
    sha256_file,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadJob:
    """Everything the upload stage needs, picklable for NVRx's worker process."""

    job_id: str
    """Unique per save; the result record carries it back."""
    run: str
    """Run name."""
    step: int
    """Training step."""
    run_dir: str
    """Local run directory."""
    names: tuple[str, ...]
    """Payload file names inside the checkpoint directory."""
    manifest_fields: dict[str, Any]
    """Caller fields of the manifest (fingerprints, weight_vote, coverage, loss, code_version, world, ...)."""
    store: dict[str, Any] | None
    """`store_spec` of the store to upload to, or None for a local-only save."""
    retry_deadline_s: float
    """Seconds to keep retrying an unavailable store."""
    started: float
    """time.time() when save() was called."""
    writer: str
    """`nvrx` or `thread`."""
    parent_pid: int = 0
    """In the worker process: the trainer's pid; the worker exits when the trainer is gone."""
    nice: int = 0
    """Niceness the worker process runs at (at least), so the training process gets the CPU first."""


_STORES: dict[str, ObjectStore] = {}  # one client per store per process


def _store_for(spec: dict[str, Any]) -> ObjectStore:
    key = json.dumps(spec, sort_keys=True)
    if key not in _STORES:
        _STORES[key] = store_from_spec(spec)
    return _STORES[key]


def with_retries(fn: Callable[[], Any], *, what: str, deadline_s: float) -> Any:
    """Call `fn` until it succeeds, retrying StoreUnavailable with exponential back-off up to `deadline_s`
    (on top of boto3's own retries). Terminal store errors are raised at once."""
    start = time.monotonic()
    delay = 0.25
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except StoreUnavailable as e:
            waited = time.monotonic() - start
            if waited + delay > deadline_s:
                raise StoreUnavailable(
                    f"{what}: gave up after {attempt} attempts over {waited:.1f}s: {e}"
                ) from e
            log.warning("%s: store unavailable (attempt %d), retrying in %.2fs: %s", what, attempt, delay, e)
            time.sleep(delay)
            delay = min(delay * 2, 8.0)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:8]}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run_upload_job(job: UploadJob, store: ObjectStore | None = None) -> dict[str, Any]:
    """Hash, write the local manifest, upload files then manifest, write the `save` record. Never raises:
    the record (returned too) says what happened. `store`: the store object to use (in the saver's own
    process); without it the store is rebuilt from `job.store` (in NVRx's worker process)."""
    run_dir = Path(job.run_dir)
    rel_dir = schema.checkpoint_dir(job.step)
    ckpt_dir = run_dir / rel_dir
    error: str | None = None
    uploaded = False
    nbytes = 0
    try:
        files = []
        for name in job.names:
            path = ckpt_dir / name
            size = path.stat().st_size
            nbytes += size
            files.append({"name": name, "key": rel_dir + name, "size": size, "sha256": sha256_file(path)})
        manifest = schema.record("manifest", run=job.run, step=job.step, files=files, **job.manifest_fields)
        data = dump_json(manifest)
        write_atomic(ckpt_dir / MANIFEST_FILE, data)  # local copy complete: manifest last
        if store is None and job.store is not None:
            store = _store_for(job.store)
        if store is not None:
            uploaded = publish_checkpoint(
                store,
                run=job.run,
                step=job.step,
                folder=ckpt_dir,
                files=files,
                manifest=data,
                deadline_s=job.retry_deadline_s,
            )
    except Exception as e:  # reported, never raised into training
        error = f"{type(e).__name__}: {e}"
    result = save_record(job, error=error, uploaded=uploaded, nbytes=nbytes)
    write_save_record(job, result)
    if store is not None and uploaded:
        try:  # best effort: the local record is the one the saver reads
            store.put_bytes(schema.store_key(job.run, schema.save_path(job.step)), dump_json(result))
        except StoreError as e:
            log.warning("save record for step %d not uploaded: %s", job.step, e)
    return result


def save_record(
    job: UploadJob, *, error: str | None, uploaded: bool = False, nbytes: int = 0
) -> dict[str, Any]:
    """The `save` record of `job`: ok when `error` is None."""
    return schema.record(
        "save",
        run=job.run,
        step=job.step,
        ok=error is None,
        error=error,
        job_id=job.job_id,
        uploaded=uploaded,
        nbytes=nbytes,
        writer=job.writer,
        duration_s=time.time() - job.started,
    )


def write_save_record(job: UploadJob, record: dict[str, Any]) -> None:
    """Write the save record under the run dir (the copy the saver reads back); logged, never raised."""
    try:
        out = Path(job.run_dir) / schema.save_path(job.step)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, dump_json(record))
    except OSError as e:
        log.error("cannot write the save record for step %d: %s", job.step, e)


def publish_checkpoint(
    store: ObjectStore,
    *,
    run: str,
    step: int,
    folder: Path,
    files: list[dict[str, Any]],
    manifest: bytes,
    deadline_s: float,
) -> bool:
    """Publish checkpoint `step` of `run`: each of `files` (`{name, key, size, sha256}`, read from
    `folder / name`, stored at the run's `key`, with its SHA-256 in the object's metadata and its stored
    size checked), then `manifest` (the record's bytes) as its `manifest.json`, LAST and with
    `If-None-Match: *`. Every store call is retried while the store is unavailable, up to `deadline_s`.
    PreconditionFailed when the store already has a manifest for `step` (a published checkpoint is never
    overwritten); StoreError when a file's stored size differs. Used for unsharded saves (the upload
    stage) and sharded ones (training.checkpoint.sharded_store)."""
    manifest_key = schema.store_key(run, schema.manifest_path(step))

    existing = with_retries(
        lambda: store.head(manifest_key), what=f"head {manifest_key}", deadline_s=deadline_s
    )
    if existing is not None:
        # A resumed run saving the same step again: never overwrite a published checkpoint.
        raise PreconditionFailed(
            f"{manifest_key} already exists in {store.describe()}: checkpoint not overwritten"
        )
    for f in files:
        key = schema.store_key(run, f["key"])
        path = folder / f["name"]
        info = with_retries(
            functools.partial(store.put_file, key, path, sha256=f["sha256"]),
            what=f"upload {key}",
            deadline_s=deadline_s,
        )
        if info.size != f["size"]:
            raise StoreError(f"upload {key}: store holds {info.size} bytes, the file has {f['size']}")
    with_retries(
        lambda: store.put_bytes(manifest_key, manifest, if_none_match=True),
        what=f"put {manifest_key}",
        deadline_s=deadline_s,
    )
    return True


def lower_priority(nice: int) -> None:
    """Run the calling thread at niceness `nice` or lower priority (on Linux niceness is per thread and
    a spawned child inherits it from the thread that started it). Best effort."""
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, nice))
    except (OSError, AttributeError):
        pass
