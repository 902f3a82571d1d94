"""Asynchronous checkpoint saves to the run dir and the object store, and loading them back.

What runs where (rank 0 of the trainer owns one `CheckpointSaver`)::

    training step ── save(): snapshot every tensor to CPU memory (a copy), return
                       │
    writer thread  ────┴─ torch.save the snapshot under run_dir/checkpoints/step-XXXXXXXX/
                       │
    upload stage   ────┴─ hash each file (SHA-256), write manifest.json locally, upload every file to the
                          store with retries and back-off, then the manifest LAST (`If-None-Match`), then
                          a `save` record (ok or the error) under saves/

The upload stage runs in NVRx's persistent async worker process (`nvidia_resiliency_ext.checkpointing.
async_ckpt.core.AsyncCallsQueue` / `PersistentAsyncCaller`, driven with `no_dist=True`), which is the part
of NVRx 0.4.1's async machinery that does not call CUDA. NVRx's `TorchAsyncCheckpoint.async_save` and its
distributed finalization call `torch.cuda.synchronize()` / `torch.cuda.current_device()` and are not used.
Where NVRx cannot be imported, the store cannot be rebuilt in another process, or the NVRx worker died,
the upload stage runs in the writer thread instead (`writer="thread"`); the step does not wait either way.

A failure (store down after the retry deadline, bad credentials, disk full) never raises into training:
it is logged, written as a `save` record with `ok: false`, and kept in `saver.last_error` / `failures`.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import json
import logging
import os
import queue
import signal
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training import schema
from training.fingerprint import combine, fingerprint_state
from training.manifest import CheckpointError, read_manifest
from training.store import (
    NotFound,
    ObjectStore,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
    sha256_file,
    store_from_env,
    store_from_spec,
    store_spec,
)

log = logging.getLogger(__name__)

#: Payload files of a checkpoint, in the order they are written and uploaded.
MODEL_FILE = "model.pt"
OPTIM_FILE = "optim.pt"
EXTRA_FILE = "extra.pt"
MANIFEST_FILE = "manifest.json"

#: Manifest fields the caller supplies (through `manifest_fields`), with the value used when absent.
CALLER_FIELDS: dict[str, Any] = {
    "weight_vote": {},
    "coverage": {},
    "loss": None,
    "code_version": "unknown",
    "world": {},
}

WRITERS = ("auto", "nvrx", "thread")


@dataclass(frozen=True, slots=True, kw_only=True)
class SaverSettings:
    """How a `CheckpointSaver` writes and uploads."""

    writer: str = "auto"
    """`nvrx`: upload in NVRx's persistent async worker process; `thread`: in the saver's writer thread;
    `auto`: nvrx when it imports and the store can be rebuilt in another process, else thread."""
    retry_deadline_s: float = 120.0
    """How long one upload keeps retrying a store that is unavailable before the save is reported failed."""
    max_pending: int = 2
    """Saves in flight at most; a further save() waits for the oldest (bounded memory for snapshots)."""
    wait_timeout_s: float = 1800.0
    """Upper bound for wait(), close() and a save() blocked by `max_pending`."""
    poll_s: float = 0.05
    """How often the writer thread looks at the upload worker."""

    def __post_init__(self) -> None:
        if self.writer not in WRITERS:
            raise ValueError(f"SaverSettings.writer = {self.writer!r}; expected one of {WRITERS}")
        for name in ("retry_deadline_s", "wait_timeout_s", "poll_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"SaverSettings.{name} = {value!r}; expected a positive number of seconds")
        if not isinstance(self.max_pending, int) or self.max_pending < 1:
            raise ValueError(f"SaverSettings.max_pending = {self.max_pending!r}; expected an int >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class SaveResult:
    """The outcome of one background save."""

    step: int
    """Training step of the checkpoint."""
    ok: bool
    """True when the files and the manifest are in the run dir and (with a store) in the store."""
    error: str | None
    """What failed, naming the file or the store; None when ok."""
    uploaded: bool
    """True when the manifest reached the store (False without a store)."""
    duration_s: float
    """Seconds from save() to the end of the upload stage."""
    nbytes: int
    """Payload bytes written."""
    writer: str
    """`nvrx` or `thread`: where the upload stage ran."""


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


# ---- the upload stage: a plain function of plain values, so it can run in another process ----------


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


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:8]}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, indent=1).encode()


def run_upload_job(job: UploadJob) -> dict[str, Any]:
    """Hash, write the local manifest, upload files then manifest, write the `save` record. Never raises:
    the record (returned too) says what happened."""
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
        data = _json_bytes(manifest)
        _write_atomic(ckpt_dir / MANIFEST_FILE, data)  # local copy complete: manifest last
        if job.store is not None:
            store = _store_for(job.store)
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
        _write_atomic(out, _json_bytes(result))
    except OSError as e:
        log.error("cannot write the save record for step %d: %s", job.step, e)
    if job.store is not None and uploaded:
        try:  # best effort: the local record is the one the saver reads
            _store_for(job.store).put_bytes(
                schema.store_key(job.run, schema.save_path(job.step)), _json_bytes(result)
            )
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
            lambda key=key, path=path, sha=f["sha256"]: store.put_file(key, path, sha256=sha),
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
    try:
        run_upload_job(job)
    except BaseException as e:  # see the docstring
        log.error("upload of step %d failed unexpectedly: %s", job.step, e)


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


class _InlineUploader:
    """Runs the upload stage in the calling (writer) thread."""

    name = "thread"

    def __init__(self, on_done: Callable[[UploadJob, dict[str, Any] | None, str | None], None]) -> None:
        self._on_done = on_done

    def schedule(self, job: UploadJob) -> None:
        self._on_done(job, run_upload_job(job), None)

    def poll(self) -> bool:
        return True

    def pending(self) -> int:
        return 0

    def close(self, timeout_s: float) -> None:
        pass


class _NvrxUploader:
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
        self._on_done(job, _read_result(job), None)

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
                result = _read_result(job)
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
            self._caller.close()  # sends DONE, joins: the worker is idle, so this is quick
        self._caller.process = None


def _read_result(job: UploadJob) -> dict[str, Any] | None:
    try:
        result = json.loads((Path(job.run_dir) / schema.save_path(job.step)).read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and result.get("job_id") == job.job_id else None


# ---- the saver ---------------------------------------------------------------------------------------


def _snapshot(obj: Any) -> Any:
    """A copy of `obj` whose tensors live in CPU memory and share nothing with the live ones."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.to("cpu", copy=True) if t.device.type == "cpu" else t.to("cpu")
    if isinstance(obj, Mapping):
        return {k: _snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_snapshot(v) for v in obj)
    if isinstance(obj, int | float | str | bool | type(None)):
        return obj
    return copy.deepcopy(obj)


@dataclass(slots=True, kw_only=True)
class _Pending:
    step: int
    model_state: Any
    optim_state: Any
    extra: Any
    manifest_fields: dict[str, Any]
    started: float


_STOP = object()


class CheckpointSaver:
    """Saves checkpoints in the background on rank 0; see the module docstring for what runs where.

    The training loop calls `save()` and carries on; `wait()` at the end of the run; `close()` last.
    """

    def __init__(
        self,
        *,
        run: str,
        run_dir: str | os.PathLike[str],
        store: ObjectStore | None = None,
        settings: SaverSettings | None = None,
    ) -> None:
        self.run = schema.check_run_name(run)
        self.run_dir = Path(run_dir)
        self.store = store
        self.settings = settings or SaverSettings()
        self.results: list[SaveResult] = []
        self.last_error: str | None = None
        self.stall_s: list[float] = []
        """Seconds each save() held the caller (snapshot + waiting for a free slot)."""
        self._spec = store_spec(store) if store is not None else None
        self._cond = threading.Condition()
        self._pending = 0
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self._uploader: _InlineUploader | _NvrxUploader | None = None
        self.writer = self._choose_writer()
        self._thread = threading.Thread(target=self._loop, name=f"checkpoint-writer-{run}", daemon=True)
        self._thread.start()
        # multiprocessing joins non-daemon children at exit: close first so NVRx's worker can finish.
        ref = weakref.ref(self)
        self._atexit = lambda: (s := ref()) is not None and s.close()
        atexit.register(self._atexit)

    def _choose_writer(self) -> str:
        wanted = self.settings.writer
        if wanted == "thread":
            return "thread"
        reason = None
        if self.store is not None and self._spec is None:
            reason = f"{type(self.store).__name__} cannot be rebuilt in another process"
        else:
            try:
                import nvidia_resiliency_ext.checkpointing.async_ckpt.core  # noqa: F401
            except ImportError as e:
                reason = f"NVRx async checkpointing does not import ({e})"
        if reason is None:
            return "nvrx"
        if wanted == "nvrx":
            raise ValueError(f"SaverSettings.writer = 'nvrx' but {reason}")
        log.info("checkpoint uploads run in the writer thread: %s", reason)
        return "thread"

    @property
    def failures(self) -> list[SaveResult]:
        with self._cond:
            return [r for r in self.results if not r.ok]

    def pending(self) -> int:
        with self._cond:
            return self._pending

    def save(
        self,
        *,
        step: int,
        model_state: Mapping[str, torch.Tensor],
        optim_state: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        manifest_fields: Mapping[str, Any] | None = None,
    ) -> Path:
        """Snapshot the state and return; the write and upload happen in the background. Returns the
        local checkpoint directory (complete once its manifest.json exists)."""
        t0 = time.perf_counter()
        if self._closed:
            raise RuntimeError("CheckpointSaver.save() after close()")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"save(step={step!r}): expected an int >= 0")
        fields = dict(CALLER_FIELDS)
        fields.update(manifest_fields or {})
        for reserved in ("run", "step", "files", "time", "kind", "schema_version"):
            if reserved in (manifest_fields or {}):
                raise ValueError(f"manifest_fields[{reserved!r}] is set by the saver; do not pass it")
        try:
            fields = json.loads(json.dumps(fields))  # a copy, and fail now on values JSON cannot hold
        except (TypeError, ValueError) as e:
            raise ValueError(f"manifest_fields cannot be written as JSON: {e}") from e
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._pending < self.settings.max_pending, timeout=self.settings.wait_timeout_s
            )
            if not ok:
                self._record_local_failure(step, "skipped: earlier saves still in flight", time.time())
                self.stall_s.append(time.perf_counter() - t0)
                return self.run_dir / schema.checkpoint_dir(step)
            self._pending += 1
        item = _Pending(
            step=step,
            model_state=_snapshot(dict(model_state)),
            optim_state=_snapshot(dict(optim_state or {})),
            extra=_snapshot(dict(extra or {})),
            manifest_fields=fields,
            started=time.time(),
        )
        self._jobs.put(item)
        self.stall_s.append(time.perf_counter() - t0)
        return self.run_dir / schema.checkpoint_dir(step)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every save so far has finished (ok or not). False if `timeout_s` ran out first."""
        timeout = self.settings.wait_timeout_s if timeout_s is None else timeout_s
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout=timeout)

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for pending saves, stop the writer thread and NVRx's worker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        timeout = self.settings.wait_timeout_s if timeout_s is None else timeout_s
        self._jobs.put(_STOP)
        self._thread.join(timeout + 10)
        if self._thread.is_alive():
            log.error("checkpoint writer thread did not stop within %.0fs", timeout + 10)

    def __enter__(self) -> CheckpointSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the writer thread --

    def _loop(self) -> None:
        try:
            while True:
                try:
                    item = self._jobs.get(timeout=self.settings.poll_s)
                except queue.Empty:
                    item = None
                if item is _STOP:
                    break
                if item is not None:
                    self._write(item)
                if self._uploader is not None and not self._uploader.poll():
                    log.error("NVRx upload worker died; uploads continue in the writer thread")
                    self._uploader = _InlineUploader(self._on_done)
                    self.writer = "thread"
        finally:
            if self._uploader is not None:
                self._uploader.close(self.settings.wait_timeout_s)
            self._fail_leftovers()

    def _fail_leftovers(self) -> None:
        with self._cond:
            left = self._pending
        if left:
            log.error("%d checkpoint saves did not finish before close()", left)
            with self._cond:
                self._pending = 0
                self.last_error = f"{left} saves did not finish before close()"
                self._cond.notify_all()

    def _get_uploader(self) -> _InlineUploader | _NvrxUploader:
        if self._uploader is None:
            if self.writer == "nvrx":
                try:
                    self._uploader = _NvrxUploader(self._on_done)
                except Exception as e:  # NVRx present but unusable: still save
                    log.error("NVRx async worker unavailable (%s); uploading in the writer thread", e)
                    self.writer = "thread"
            if self._uploader is None:
                self._uploader = _InlineUploader(self._on_done)
        return self._uploader

    def _write(self, item: _Pending) -> None:
        ckpt_dir = self.run_dir / schema.checkpoint_dir(item.step)
        job = UploadJob(
            job_id=uuid.uuid4().hex,
            run=self.run,
            step=item.step,
            run_dir=str(self.run_dir),
            names=(MODEL_FILE, OPTIM_FILE, EXTRA_FILE),
            manifest_fields=item.manifest_fields,
            store=self._spec,
            retry_deadline_s=self.settings.retry_deadline_s,
            started=item.started,
            writer=self.writer,
            parent_pid=os.getpid(),
        )
        try:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            # An older manifest of the same step would vouch for files about to change: remove it first.
            (ckpt_dir / MANIFEST_FILE).unlink(missing_ok=True)
            for name, obj in (
                (MODEL_FILE, item.model_state),
                (OPTIM_FILE, item.optim_state),
                (EXTRA_FILE, item.extra),
            ):
                tmp = ckpt_dir / f".tmp-{name}"
                with open(tmp, "wb") as f:
                    torch.save(obj, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, ckpt_dir / name)
            if "fingerprints" not in item.manifest_fields:
                fps = fingerprint_state(item.model_state)
                item.manifest_fields["fingerprints"] = fps
                item.manifest_fields.setdefault("fingerprint", combine(fps))
        except Exception as e:
            self._on_done(job, None, f"writing {ckpt_dir}: {type(e).__name__}: {e}")
            return
        finally:
            item.model_state = item.optim_state = item.extra = None  # free the snapshot early
        uploader = self._get_uploader()
        if uploader.name != job.writer:
            job = dataclasses.replace(job, writer=uploader.name)
        uploader.schedule(job)

    def _record_local_failure(self, step: int, error: str, started: float) -> None:
        result = SaveResult(
            step=step,
            ok=False,
            error=error,
            uploaded=False,
            duration_s=time.time() - started,
            nbytes=0,
            writer=self.writer,
        )
        self.results.append(result)
        self.last_error = f"step {step}: {error}"
        log.error("checkpoint save of step %d failed: %s", step, error)

    def _on_done(self, job: UploadJob, record: dict[str, Any] | None, error: str | None) -> None:
        if record is None:
            error = error or "the upload stage left no result"
            try:  # leave a durable trace even when the stage itself could not
                rec = schema.record(
                    "save",
                    run=job.run,
                    step=job.step,
                    ok=False,
                    error=error,
                    job_id=job.job_id,
                    uploaded=False,
                    nbytes=0,
                    writer=job.writer,
                    duration_s=time.time() - job.started,
                )
                out = self.run_dir / schema.save_path(job.step)
                out.parent.mkdir(parents=True, exist_ok=True)
                _write_atomic(out, _json_bytes(rec))
            except OSError:
                pass
            result = SaveResult(
                step=job.step,
                ok=False,
                error=error,
                uploaded=False,
                duration_s=time.time() - job.started,
                nbytes=0,
                writer=job.writer,
            )
        else:
            result = SaveResult(
                step=job.step,
                ok=bool(record["ok"]),
                error=record.get("error"),
                uploaded=bool(record.get("uploaded")),
                duration_s=float(record.get("duration_s", 0.0)),
                nbytes=int(record.get("nbytes", 0)),
                writer=str(record.get("writer", job.writer)),
            )
        with self._cond:
            self.results.append(result)
            if not result.ok:
                self.last_error = f"step {job.step}: {result.error}"
            self._pending -= 1
            self._cond.notify_all()
        if result.ok:
            log.info(
                "checkpoint step %d saved (%d bytes, %.2fs, %s)",
                job.step,
                result.nbytes,
                result.duration_s,
                "uploaded" if result.uploaded else "local only",
            )
        else:
            log.error("checkpoint save of step %d failed (training goes on): %s", job.step, result.error)


# ---- loading -----------------------------------------------------------------------------------------


def _torch_load(path: Path, label: str) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{label}: torch.load(weights_only=True) failed: {e}") from None


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
        manifest = read_manifest(mpath.read_bytes(), str(mpath))
        return _load_dir(local, manifest, f"{local}/", verify)
    prefix = str(ref).rstrip("/") + "/"
    store = store or store_from_env()
    try:
        data = store.get_bytes(prefix + MANIFEST_FILE)
    except NotFound:
        raise CheckpointError(
            f"{prefix}{MANIFEST_FILE} not found in {store.describe()}: not a (complete) checkpoint"
        ) from None
    manifest = read_manifest(data, f"{prefix}{MANIFEST_FILE} in {store.describe()}")
    with tempfile.TemporaryDirectory(prefix="longrun-ckpt-") as tmp:
        for f in manifest["files"]:
            try:
                store.download(prefix + f["name"], Path(tmp) / f["name"])
            except NotFound:
                raise CheckpointError(f"{prefix}{f['name']}: missing in {store.describe()}") from None
        return _load_dir(Path(tmp), manifest, prefix, verify)
