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
import dataclasses
import json
import logging
import os
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training import schema
from training.checkpoint_load import LoadedCheckpoint, load_checkpoint
from training.checkpoint_upload import (
    InlineUploader,
    NvrxUploader,
    UploadJob,
    json_bytes,
    lower_priority,
    write_atomic,
)
from training.fingerprint import combine, fingerprint_state
from training.manifest import EXTRA_FILE, MANIFEST_FILE, MODEL_FILE, OPTIM_FILE, CheckpointError
from training.snapshot import SnapshotPool, nbytes
from training.store import ObjectStore, store_spec

__all__ = [
    "CheckpointError",
    "CheckpointSaver",
    "LoadedCheckpoint",
    "SaveResult",
    "SaverSettings",
    "load_checkpoint",
    "EXTRA_FILE",
    "MANIFEST_FILE",
    "MODEL_FILE",
    "OPTIM_FILE",
]

log = logging.getLogger(__name__)

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
    background_nice: int = 10
    """Niceness added to the writer thread and the upload worker, so that on a host short of cores the
    training step gets the CPU first (0: same priority as training)."""
    reuse_buffers: bool = True
    """Keep one snapshot's worth of CPU buffers between saves and copy into them (fewer page faults in
    the step's snapshot copy; costs that much host memory for the whole run)."""

    def __post_init__(self) -> None:
        if self.writer not in WRITERS:
            raise ValueError(f"SaverSettings.writer = {self.writer!r}; expected one of {WRITERS}")
        for name in ("retry_deadline_s", "wait_timeout_s", "poll_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"SaverSettings.{name} = {value!r}; expected a positive number of seconds")
        if not isinstance(self.background_nice, int) or not 0 <= self.background_nice <= 19:
            raise ValueError(
                f"SaverSettings.background_nice = {self.background_nice!r}; expected an int in 0..19"
            )
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


# ---- the saver ---------------------------------------------------------------------------------------


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
        self._nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + self.settings.background_nice)
        self._pool = SnapshotPool(max_spare_bytes=0)  # grows to one snapshot's size with reuse_buffers
        self._cond = threading.Condition()
        self._pending = 0
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self._uploader: InlineUploader | NvrxUploader | None = None
        self.writer = self._choose_writer()
        self._thread = threading.Thread(target=self._loop, name=f"checkpoint-writer-{run}", daemon=True)
        self._thread.start()
        # multiprocessing joins non-daemon children at exit: close first so NVRx's worker can finish.
        ref = weakref.ref(self)

        def close_at_exit() -> None:
            saver = ref()
            if saver is not None:
                saver.close()

        self._atexit = close_at_exit
        atexit.register(close_at_exit)

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
        # One snapshot call: on CUDA its non-blocking copies share one fence.
        snap_model, snap_optim, snap_extra = self._pool.snapshot(
            (dict(model_state), dict(optim_state or {}), dict(extra or {}))
        )
        item = _Pending(
            step=step,
            model_state=snap_model,
            optim_state=snap_optim,
            extra=snap_extra,
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
        lower_priority(self._nice)  # also the NVRx worker's, which this thread starts
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
                    self._uploader = InlineUploader(self._on_done, self.store)
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

    def _get_uploader(self) -> InlineUploader | NvrxUploader:
        if self._uploader is None:
            if self.writer == "nvrx":
                try:
                    self._uploader = NvrxUploader(self._on_done)
                except Exception as e:  # NVRx present but unusable: still save
                    log.error("NVRx async worker unavailable (%s); uploading in the writer thread", e)
                    self.writer = "thread"
            if self._uploader is None:
                self._uploader = InlineUploader(self._on_done, self.store)
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
            nice=self._nice,
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
            if self.settings.reuse_buffers:
                size = sum(nbytes(x) for x in (item.model_state, item.optim_state, item.extra))
                self._pool.max_spare_bytes = max(self._pool.max_spare_bytes, size)
                for x in (item.model_state, item.optim_state, item.extra):
                    self._pool.release(x)
            item.model_state = item.optim_state = item.extra = None  # drop the snapshot early
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
                write_atomic(out, json_bytes(rec))
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
