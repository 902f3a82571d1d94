"""Asynchronous checkpoint saves to the run dir and the object store, and loading them back.

The saver is three parts, composed here (rank 0 of the trainer owns one `CheckpointSaver`)::

    training step ── save(): the snapshot queue (training.checkpoint.snapshot_queue) admits the save, copies every
                       │       tensor to CPU memory, queues it, returns
    writer thread  ────┴─ the writer (training.checkpoint.writer): torch.save under
                       │  run_dir/checkpoints/step-XXXXXXXX/
    uploader       ────┴─ the upload stage (training.checkpoint.upload): hash each file (SHA-256), write
                          manifest.json locally, upload every file with retries and back-off, then the
                          manifest LAST (`If-None-Match`), then the `save` record (ok or the error)

The uploader is declared in `training.checkpoint.uploaders` with two implementations: NVRx's persistent async worker
process (`writer="nvrx"`, the CUDA-free part of NVRx 0.4.1's async checkpointing) and the writer thread
itself (`writer="thread"`), used where NVRx cannot be imported, the store cannot be rebuilt in another
process, or NVRx's worker died. The step does not wait either way.

A failure (store down after the retry deadline, bad credentials, disk full) never raises into training:
it is logged, written as a `save` record with `ok: false` (one writer of that record:
`checkpoint_upload.write_save_record`), and kept in `saver.last_error` / `failures`.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from training.checkpoint.settings import CALLER_FIELDS, SaveResult, SaverSettings
from training.checkpoint.snapshot_queue import STOP, PendingSave, SnapshotQueue
from training.checkpoint.upload import UploadJob, lower_priority, save_record, write_save_record
from training.checkpoint.uploaders import NvrxUploader, ThreadUploader, Uploader, choose_writer
from training.checkpoint.writer import PAYLOAD, write_payload
from training.records import schema
from training.records.job import Save
from training.store.factory import store_spec
from training.store.interface import ObjectStore

__all__ = ["CheckpointSaver"]

log = logging.getLogger(__name__)

# ---- the saver ---------------------------------------------------------------------------------------


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
        self._queue = SnapshotQueue(
            max_pending=self.settings.max_pending, reuse_buffers=self.settings.reuse_buffers
        )
        self._lock = threading.Lock()  # results and last_error: the writer thread and callers
        self._closed = False
        self._uploader: Uploader | None = None
        self.writer = choose_writer(self.settings.writer, self.store, self._spec)
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

    @property
    def failures(self) -> list[SaveResult]:
        with self._lock:
            return [r for r in self.results if not r.ok]

    def pending(self) -> int:
        return self._queue.pending()

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
        queued = self._queue.put(
            step=step,
            model_state=model_state,
            optim_state=optim_state or {},
            extra=extra or {},
            manifest_fields=fields,
            timeout_s=self.settings.wait_timeout_s,
        )
        if not queued:
            self._record_local_failure(step, "skipped: earlier saves still in flight", time.time())
        self.stall_s.append(time.perf_counter() - t0)
        return self.run_dir / schema.checkpoint_dir(step)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every save so far has finished (ok or not). False if `timeout_s` ran out first."""
        return self._queue.wait_empty(self.settings.wait_timeout_s if timeout_s is None else timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for pending saves, stop the writer thread and NVRx's worker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        timeout = self.settings.wait_timeout_s if timeout_s is None else timeout_s
        self._queue.stop()
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
                item = self._queue.get(self.settings.poll_s)
                if item is STOP:
                    break
                if isinstance(item, PendingSave):
                    self._write(item)
                if self._uploader is not None and not self._uploader.poll():
                    log.error("NVRx upload worker died; uploads continue in the writer thread")
                    self._uploader = ThreadUploader(self._on_done, self.store)
                    self.writer = "thread"
        finally:
            if self._uploader is not None:
                self._uploader.close(self.settings.wait_timeout_s)
            self._fail_leftovers()

    def _fail_leftovers(self) -> None:
        left = self._queue.abandon()
        if left:
            log.error("%d checkpoint saves did not finish before close()", left)
            with self._lock:
                self.last_error = f"{left} saves did not finish before close()"

    def _get_uploader(self) -> Uploader:
        if self._uploader is None:
            if self.writer == "nvrx":
                try:
                    self._uploader = NvrxUploader(self._on_done)
                except Exception as e:  # NVRx present but unusable: still save
                    log.error("NVRx async worker unavailable (%s); uploading in the writer thread", e)
                    self.writer = "thread"
            if self._uploader is None:
                self._uploader = ThreadUploader(self._on_done, self.store)
        return self._uploader

    def _write(self, item: PendingSave) -> None:
        ckpt_dir = self.run_dir / schema.checkpoint_dir(item.step)
        job = UploadJob(
            job_id=uuid.uuid4().hex,
            run=self.run,
            step=item.step,
            run_dir=str(self.run_dir),
            names=PAYLOAD,
            manifest_fields=item.manifest_fields,
            store=self._spec,
            retry_deadline_s=self.settings.retry_deadline_s,
            started=item.started,
            writer=self.writer,
            parent_pid=os.getpid(),
            nice=self._nice,
        )
        try:
            write_payload(ckpt_dir, item)
        except Exception as e:
            self._on_done(job, None, f"writing {ckpt_dir}: {type(e).__name__}: {e}")
            return
        finally:
            self._queue.recycle(item)  # drop (or keep for reuse) the snapshot early
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
        with self._lock:
            self.results.append(result)
            self.last_error = f"step {step}: {error}"
        log.error("checkpoint save of step %d failed: %s", step, error)

    def _on_done(self, job: UploadJob, record: dict[str, Any] | None, error: str | None) -> None:
        save = None
        if record is not None:
            try:
                save = Save.from_json(record)
            except ValueError as e:  # a result this saver cannot read is a failed save, not a crash
                error = f"unreadable save record: {e}"
        if save is None:
            error = error or "the upload stage left no result"
            write_save_record(job, save_record(job, error=error))  # a durable trace all the same
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
                ok=save.ok,
                error=save.error,
                uploaded=bool(save.uploaded),
                duration_s=save.duration_s or 0.0,
                nbytes=save.nbytes or 0,
                writer=save.writer or job.writer,
            )
        with self._lock:
            self.results.append(result)
            if not result.ok:
                self.last_error = f"step {job.step}: {result.error}"
        self._queue.finished()
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
