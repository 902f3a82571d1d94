"""The event writer: alerts durably first, check records cheaply, a progress heartbeat.

Everything goes to the run dir (same relative paths as in the store) and, when one is configured, to the
store under runs/<run>/. Costs, per step: one JSONL line appended locally for each check that ran, one
small atomic file for progress. The store sees check records in batches (every `flush_every` steps, at
checkpoints, on an alert, at exit; no batch spans more than `schema.CHECK_BATCH_MAX_SPAN` steps) and
progress at most every `progress_interval_s`. A batch that cannot reach the store stays pending for the
next flush; the last one, at exit, is retried through an outage for up to `CHECKS_CLOSE_DEADLINE_S`.

An alert is different: it is written and fsynced locally, then put in the store (retried), before the
caller does anything else, because the orchestrator acts on it after this process is gone. It carries
the Slurm job id and is signed with the job's key (`training.records.signing`): the orchestrator acts only on
an alert whose signature, run, job and suspect nodes all check out.

Every rank writes its own check records (checks/<first>-<last>-r<rank>.jsonl): the pre-incident pick
counts a step as passed only when every rank recorded the pass, so a rank that wrote nothing is not a
pass. Only rank 0 writes progress and the live check file.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from training.checkpoint.upload import with_retries
from training.records import schema, signing
from training.store.interface import ObjectStore, StoreError, put_json

log = logging.getLogger("training.events")

STORE_ATTEMPTS = 4
# An alert is what the orchestrator acts on after this process is gone: it keeps trying through a store
# outage for this long (under the verdict barrier's 60 s, so the peers wait for it), then once more at
# close; until then it is spooled (it is in the run dir, fsynced, from the start).
ALERT_UPLOAD_DEADLINE_S = float(os.environ.get("LONGRUN_ALERT_UPLOAD_DEADLINE_S", "45"))
ALERT_CLOSE_DEADLINE_S = float(os.environ.get("LONGRUN_ALERT_CLOSE_DEADLINE_S", "60"))
# The last check batch (at close) has no next flush to ride on: it keeps trying through a store outage
# for this long. Without it the pick cannot count this rank's passes since its previous batch, and the
# relaunch resumes from an older checkpoint than it could (chaos cell attribute x S3, docs/reliability.md).
CHECKS_CLOSE_DEADLINE_S = float(os.environ.get("LONGRUN_CHECKS_CLOSE_DEADLINE_S", "60"))


def write_durably(path: Path, obj: Any) -> None:
    """Write JSON atomically and fsync the file and its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, sort_keys=True, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, obj: Any) -> None:
    """Atomic but not fsynced: for the heartbeat, which the next step overwrites anyway."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    tmp.write_text(json.dumps(obj, sort_keys=True))
    os.replace(tmp, path)


def _first_batch(pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The longest head of `pending` whose steps span at most schema.CHECK_BATCH_MAX_SPAN (the readers'
    bound: longrun.checkpoints.pick lists only the batches near an alert). Pending records pile up while
    the store is unreachable, so one flush may write several batches."""
    low = high = pending[0]["step"]
    for n, rec in enumerate(pending):
        low, high = min(low, rec["step"]), max(high, rec["step"])
        if high - low + 1 > schema.CHECK_BATCH_MAX_SPAN:
            return pending[:n]
    return pending


class EventWriter:
    """One per rank. Every rank writes its check records; only rank 0 writes progress and the live
    check file; any rank may write an alert (signed with the job's key when it has one)."""

    def __init__(
        self,
        *,
        run: str,
        run_dir: Path,
        store: ObjectStore | None,
        rank: int,
        flush_every: int,
        progress_interval_s: float,
    ) -> None:
        self.run, self.run_dir, self.store, self.rank = run, Path(run_dir), store, rank
        self.flush_every, self.progress_interval_s = flush_every, progress_interval_s
        self._pending: list[dict[str, Any]] = []
        self._last_progress_put = 0.0
        self._unsent_progress: dict[str, Any] | None = None
        self._live = None
        self._unsent_alerts: list[tuple[str, dict[str, Any]]] = []
        # Read once: a key that does not parse fails the start-up, not the alert.
        self._key = signing.key_from_env()
        job = os.environ.get("SLURM_JOB_ID", "")
        self._job_id = int(job) if job.isdigit() else None
        if rank == 0:
            live = self.run_dir / "checks-live" / f"r{rank:03d}.jsonl"
            live.parent.mkdir(parents=True, exist_ok=True)
            self._live = open(live, "a", buffering=1)

    # ---- store -------------------------------------------------------------------------------------

    def _put(self, relative: str, obj: Any, *, attempts: int = 1) -> bool:
        if self.store is None:
            return True
        key = schema.store_key(self.run, relative)
        for i in range(attempts):
            try:
                put_json(self.store, key, obj)
                return True
            except StoreError as e:
                log.warning("store write %s failed (attempt %d/%d): %s", key, i + 1, attempts, e)
                if i + 1 < attempts:
                    time.sleep(0.5 * 2**i)
        return False

    def _put_until(self, relative: str, obj: Any, deadline_s: float) -> bool:
        """Put with back-off (0.5 s doubling to 8 s) until it lands or `deadline_s` has passed."""
        end = time.monotonic() + deadline_s
        delay = 0.5
        while True:
            if self._put(relative, obj):
                return True
            if time.monotonic() + delay > end:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 8.0)

    def send_unsent_alerts(self, deadline_s: float = 0.0) -> int:
        """Retry the spooled alerts (each until `deadline_s`); returns how many are still unsent."""
        still = []
        for relative, alert in self._unsent_alerts:
            if self._put_until(relative, alert, deadline_s):
                log.warning("spooled alert %s reached the store", relative)
            else:
                still.append((relative, alert))
        self._unsent_alerts = still
        return len(still)

    # ---- records -----------------------------------------------------------------------------------

    def alert(self, alert: dict[str, Any]) -> Path:
        """Write an alert record durably: run dir (fsync) then store (retried). Returns the local path."""
        schema.validate("alert", alert)
        if self._job_id is not None:
            alert = {**alert, "job_id": self._job_id}
        if self._key is not None:
            alert = signing.sign(alert, self._key)
        else:
            log.warning(
                "no %s in the environment: the alert is unsigned (the orchestrator will not act on it)",
                signing.KEY_ENV,
            )
        relative = schema.alert_path(alert["step"], alert["check"], f"r{self.rank:03d}-{int(time.time())}")
        path = self.run_dir / relative
        write_durably(path, alert)
        if not self._put_until(relative, alert, ALERT_UPLOAD_DEADLINE_S):
            self._unsent_alerts.append((relative, alert))
            log.error(
                "alert is in %s but NOT in the store %s yet; spooled, retried at close",
                path,
                self.store and self.store.describe(),
            )
        log.error("SDC ALERT written: %s", path)
        return path

    def check(self, rec: dict[str, Any]) -> None:
        schema.validate("check", rec)
        if self._live is not None:
            self._live.write(json.dumps(rec, sort_keys=True) + "\n")
        self._pending.append(rec)
        if rec["step"] - self._pending[0]["step"] + 1 >= self.flush_every:
            self.flush()

    def flush(self, deadline_s: float = 0.0) -> bool:
        """Write the pending check records as one batch file (run dir and store). An unreachable store is
        retried (`checkpoint_upload.with_retries`: back-off doubling to 8 s) until `deadline_s` has passed;
        records that did not reach the store stay pending for the next flush. True when nothing is left
        pending."""
        if self._unsent_alerts:  # the store may be back: one try each, no waiting
            self.send_unsent_alerts()
        while self._pending:
            batch = _first_batch(self._pending)
            first, last = min(r["step"] for r in batch), max(r["step"] for r in batch)
            relative = schema.check_batch_path(first, last, self.rank)
            body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in batch)
            path = self.run_dir / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
            if self.store is not None:
                store, key = self.store, schema.store_key(self.run, relative)
                try:
                    with_retries(
                        lambda: store.put_bytes(key, body.encode()),  # noqa: B023 - called at once
                        what=f"check batch {relative}",
                        deadline_s=deadline_s,
                    )
                except StoreError as e:  # unreachable past the deadline, or a terminal error at once
                    log.warning("check batch %s not in the store (%s); kept pending", relative, e)
                    return False
            del self._pending[: len(batch)]
        return True

    def progress(self, rec: dict[str, Any], *, force: bool = False) -> None:
        if self.rank != 0:
            return
        schema.validate("progress", rec)
        write_atomic(self.run_dir / schema.PROGRESS_PATH, rec)
        self._unsent_progress = rec
        now = time.monotonic()
        if force or now - self._last_progress_put >= self.progress_interval_s:
            if self._put(schema.PROGRESS_PATH, rec):
                self._last_progress_put = now
                self._unsent_progress = None

    def report(self, rec: dict[str, Any]) -> None:
        schema.validate("report", rec)
        write_durably(self.run_dir / schema.REPORT_PATH, rec)
        self._put(schema.REPORT_PATH, rec, attempts=STORE_ATTEMPTS)

    def put_record(self, relative: str, obj: dict[str, Any]) -> None:
        """A small record that must survive this process (segment, fault): run dir (fsync), then store."""
        write_durably(self.run_dir / relative, obj)
        if not self._put(relative, obj, attempts=STORE_ATTEMPTS):
            log.error("record %s is in the run dir but NOT in the store", relative)

    def close(self) -> None:
        if self._unsent_alerts and self.send_unsent_alerts(ALERT_CLOSE_DEADLINE_S):
            for relative, _alert in self._unsent_alerts:
                log.error("alert %s never reached the store; it is only in %s", relative, self.run_dir)
        if not self.flush(CHECKS_CLOSE_DEADLINE_S):
            log.error(
                "check records %s..%s of rank %d are only in %s, NOT in the store: the pre-incident pick "
                "cannot count them as passed, so a relaunch may resume from an older checkpoint",
                self._pending[0]["step"],
                self._pending[-1]["step"],
                self.rank,
                self.run_dir,
            )
        if self._unsent_progress is not None:  # the last heartbeat reaches the store too
            self._put(schema.PROGRESS_PATH, self._unsent_progress)
            self._unsent_progress = None
        if self._live is not None:
            self._live.close()
            self._live = None
