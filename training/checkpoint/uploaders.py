"""Where the upload stage of a checkpoint save runs: one declared protocol, two implementations.

`Uploader` is what the saver's writer thread asks of one: `schedule` a job, `poll` for finished ones (False
when the uploader died and must be replaced), count what is `pending`, `close` within a bound. Each job's
end is reported once through the `on_done(job, record, error)` callback the uploader was built with.

`choose_writer` says which one a saver uses (`SaverSettings.writer`: auto, nvrx or thread).

- `ThreadUploader` runs the stage in the writer thread itself.
- `NvrxUploader` runs it in NVRx's persistent async worker process: the CUDA-free part of NVRx 0.4.1's
  async checkpointing (`AsyncCallsQueue` + `PersistentAsyncCaller`, finalized with `no_dist=True`).
  It uses the public attributes `PersistentAsyncCaller` documents in its constructor (`rank`, `process`,
  `queue`) for three things NVRx has no call for: the rank when no process group exists, telling a dead
  worker from a busy one, and a bounded stop (NVRx's `close()` joins without a bound, and waits forever
  for a worker that died).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from training.checkpoint.upload import UploadJob, lower_priority, run_upload_job
from training.records import schema
from training.store.interface import ObjectStore

log = logging.getLogger(__name__)

OnDone = Callable[[UploadJob, dict[str, Any] | None, str | None], None]
"""Called once per job: the save record it left (None if none), and an error when there is no record."""


class Uploader(Protocol):
    """Runs the upload stage of the saves the writer thread hands it."""

    name: str
    """`thread` or `nvrx`: recorded as the save's `writer`."""

    def schedule(self, job: UploadJob) -> None: ...

    def poll(self) -> bool:
        """Report finished jobs. False when the uploader died; its jobs are reported failed."""
        ...

    def pending(self) -> int: ...

    def close(self, timeout_s: float) -> None:
        """Finish (or report failed) every job within `timeout_s`, then stop."""
        ...


_DEATHSIG_SET = False


def choose_writer(wanted: str, store: ObjectStore | None, spec: dict[str, Any] | None) -> str:
    """Where the saver's uploads run: `nvrx` (NVRx's async worker) or `thread`. `wanted` is
    `SaverSettings.writer`; `spec` is the store's spec (None when it cannot be rebuilt in another process).
    `auto` falls back to the thread, saying why; `nvrx` that cannot run raises."""
    if wanted == "thread":
        return "thread"
    reason = None
    if store is not None and spec is None:
        reason = f"{type(store).__name__} cannot be rebuilt in another process"
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


class ThreadUploader:
    """Runs the upload stage in the calling (writer) thread."""

    name = "thread"

    def __init__(self, on_done: OnDone, store: ObjectStore | None) -> None:
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

    def __init__(self, on_done: OnDone) -> None:
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
