"""The upload stage of a checkpoint save: hash, local manifest, upload with retries, manifest last, record.

`run_upload_job` is a plain function of a picklable `UploadJob`, so it runs either in the saver's writer
thread (`InlineUploader`) or in NVRx's persistent async worker process (`NvrxUploader`), which is the
CUDA-free part of NVRx 0.4.1's async checkpointing: `AsyncCallsQueue` + `PersistentAsyncCaller` driven
with `no_dist=True` (no `torch.cuda.*`, no collective). See docs/checkpoints.md.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training import schema
from training.manifest import MANIFEST_FILE
from training.store import (
    ObjectStore,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
    sha256_file,
    store_from_spec,
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


def json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, indent=1).encode()


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
        data = json_bytes(manifest)
        write_atomic(ckpt_dir / MANIFEST_FILE, data)  # local copy complete: manifest last
        if store is None and job.store is not None:
            store = _store_for(job.store)
        if store is not None:
            uploaded = _upload(store, job, files, data)
    except Exception as e:  # reported, never raised into training
        error = f"{type(e).__name__}: {e}"
    result = schema.record(
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
    try:
        out = run_dir / schema.save_path(job.step)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, json_bytes(result))
    except OSError as e:
        log.error("cannot write the save record for step %d: %s", job.step, e)
    if store is not None and uploaded:
        try:  # best effort: the local record is the one the saver reads
            store.put_bytes(schema.store_key(job.run, schema.save_path(job.step)), json_bytes(result))
        except StoreError as e:
            log.warning("save record for step %d not uploaded: %s", job.step, e)
    return result


def _upload(store: ObjectStore, job: UploadJob, files: list[dict[str, Any]], manifest: bytes) -> bool:
    manifest_key = schema.store_key(job.run, schema.manifest_path(job.step))
    deadline = job.retry_deadline_s

    existing = with_retries(
        lambda: store.head(manifest_key), what=f"head {manifest_key}", deadline_s=deadline
    )
    if existing is not None:
        # A resumed run saving the same step again: never overwrite a published checkpoint.
        raise PreconditionFailed(
            f"{manifest_key} already exists in {store.describe()}: checkpoint not overwritten"
        )
    ckpt_dir = Path(job.run_dir) / schema.checkpoint_dir(job.step)
    for f in files:
        key = schema.store_key(job.run, f["key"])
        path = ckpt_dir / f["name"]
        info = with_retries(
            functools.partial(store.put_file, key, path, sha256=f["sha256"]),
            what=f"upload {key}",
            deadline_s=deadline,
        )
        if info.size != f["size"]:
            raise StoreError(f"upload {key}: store holds {info.size} bytes, the file has {f['size']}")
    with_retries(
        lambda: store.put_bytes(manifest_key, manifest, if_none_match=True),
        what=f"put {manifest_key}",
        deadline_s=deadline,
    )
    return True


_DEATHSIG_SET = False


def nvrx_upload_entry(job: UploadJob) -> None:
    """The function NVRx's worker process runs. It must not raise: an exception ends NVRx's worker loop
    and its caller would then wait forever."""
    global _DEATHSIG_SET
    if not _DEATHSIG_SET:
        _DEATHSIG_SET = True
        _exit_with_parent(job.parent_pid)
        lower_priority(job.nice)
    try:
        run_upload_job(job)
    except BaseException as e:  # see the docstring
        log.error("upload of step %d failed unexpectedly: %s", job.step, e)


def lower_priority(nice: int) -> None:
    """Run the calling thread at niceness `nice` or lower priority (on Linux niceness is per thread and
    a spawned child inherits it from the thread that started it). Best effort."""
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, nice))
    except (OSError, AttributeError):
        pass


def _exit_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGTERM this worker when the trainer dies, so a killed trainer leaves no orphan."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent_pid and os.getppid() != parent_pid:  # the trainer died before prctl took effect
        os._exit(0)


# ---- where the upload stage runs ---------------------------------------------------------------------


class InlineUploader:
    """Runs the upload stage in the calling (writer) thread."""

    name = "thread"

    def __init__(
        self,
        on_done: Callable[[UploadJob, dict[str, Any] | None, str | None], None],
        store: ObjectStore | None,
    ) -> None:
        self._on_done = on_done
        self._store = store

    def schedule(self, job: UploadJob) -> None:
        self._on_done(job, run_upload_job(job, self._store), None)

    def poll(self) -> bool:
        return True

    def pending(self) -> int:
        return 0

    def close(self, timeout_s: float) -> None:
        pass


class NvrxUploader:
    """Runs the upload stage in NVRx's persistent async worker (a spawned process), CUDA-free calls only."""

    name = "nvrx"

    def __init__(self, on_done: Callable[[UploadJob, dict[str, Any] | None, str | None], None]) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import (
            AsyncCallsQueue,
            AsyncRequest,
            PersistentAsyncCaller,
        )

        self._Request = AsyncRequest
        self._on_done = on_done
        self._queue = AsyncCallsQueue(persistent=True)
        caller = PersistentAsyncCaller()
        # NVRx asks torch.distributed for the rank (logging only) when it is unset; the saver may run
        # without a process group, so give it the rank up front.
        caller.rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self._queue.persistent_caller = caller
        self._caller = caller
        self._jobs: dict[str, UploadJob] = {}

    def schedule(self, job: UploadJob) -> None:
        self._jobs[job.job_id] = job
        request = self._Request(nvrx_upload_entry, (job,), [lambda: self._finish(job)])
        self._queue.schedule_async_request(request)

    def _finish(self, job: UploadJob) -> None:
        self._jobs.pop(job.job_id, None)
        self._on_done(job, read_result(job), None)

    def pending(self) -> int:
        return self._queue.get_num_unfinalized_calls()

    def poll(self) -> bool:
        """Finalize finished uploads. False when the worker process died with uploads in flight; those are
        reported failed and this uploader must not be used again."""
        self._queue.maybe_finalize_async_calls(blocking=False, no_dist=True)
        proc = self._caller.process
        if self.pending() and (proc is None or not proc.is_alive()):
            self._queue.maybe_finalize_async_calls(blocking=False, no_dist=True)  # results that raced
            code = None if proc is None else proc.exitcode
            for job in list(self._jobs.values()):
                result = read_result(job)
                self._on_done(job, result, None if result else f"NVRx upload worker died (exit code {code})")
            self._jobs.clear()
            self._abandon()
            return False
        return True

    def _abandon(self) -> None:
        # NVRx's close() (also run by its __del__) waits for a dead worker forever: detach the process.
        proc = self._caller.process
        self._caller.process = None
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(5)

    def close(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.pending() and time.monotonic() < deadline:
            if not self.poll():
                return
            time.sleep(0.05)
        if self.pending():
            log.error("NVRx upload worker still busy after %.0fs; terminating it", timeout_s)
            for job in list(self._jobs.values()):
                self._on_done(job, None, f"upload of step {job.step} did not finish within {timeout_s:.0f}s")
            self._jobs.clear()
            self._abandon()
            return
        proc = self._caller.process
        if proc is not None and proc.is_alive():
            # NVRx's close() sends the same "DONE" but then joins without a bound; bound it here.
            self._caller.queue.put("DONE")
            proc.join(max(5.0, deadline - time.monotonic()))
        self._abandon()  # terminates it only if it did not stop


def read_result(job: UploadJob) -> dict[str, Any] | None:
    try:
        result = json.loads((Path(job.run_dir) / schema.save_path(job.step)).read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and result.get("job_id") == job.job_id else None
