"""The two sides of the store, and the one place that decides which side a key lives on.

The **job side** holds what the job writes about its own run (alerts, check records, progress, checkpoints,
save outcomes, the run report). The **orchestrator side** holds everything the orchestrator decides on
(drain ledger, probe references, incidents, validations, promotions, picks, suspect marks, directives,
node history, audit results, security events): the job's identity must not be able to write it, so a job
cannot lift the rate limit, forge an incident or promote its own checkpoint.

The sides are two buckets (`LONGRUN_BUCKET`, `LONGRUN_ORCH_BUCKET`) or, for a local directory store, two
directories. `SidedStore` routes every call by `side_of(key)`, so readers and writers keep one key layout.
A key this module does not know is on the orchestrator side: a new job kind then fails loudly on the job's
first write (access denied), instead of a new orchestrator kind landing where the job may write.

No torch, no Airflow, no boto3 here: both sides import it.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterator
from typing import Literal

from training.store.interface import ObjectInfo, ObjectStore

Side = Literal["job", "orchestrator"]
JOB: Side = "job"
ORCHESTRATOR: Side = "orchestrator"

#: Folders (or files) under `runs/<run>/` that the job writes. Everything else is the orchestrator's.
JOB_PATHS = (
    "alerts/",
    "checks/",
    "progress/",
    "checkpoints/",
    "saves/",
    "report.json",
    "segments/",  # where each trainer incarnation started and ended (training.segment)
    "faults/",  # a drill's fault, fired (training.segment)
)
#: Folders under `runs/<run>/` that the orchestrator writes and the job may read (its own directives).
JOB_READABLE = ("directives/",)


def side_of(key: str) -> Side:
    """The side `key` (or a key prefix) lives on."""
    parts = key.split("/", 2)
    if len(parts) == 3 and parts[0] == "runs" and parts[1]:
        rest = parts[2]
        if any(rest.startswith(p) if p.endswith("/") else rest == p for p in JOB_PATHS):
            return JOB
    return ORCHESTRATOR


def _spans_both(prefix: str) -> bool:
    """Can keys under `prefix` lie on both sides? (`""`, `runs/`, `runs/<run>/`, `runs/<run>/c`, ...)"""
    parts = prefix.split("/", 2)
    if len(parts) < 3:
        return "runs/".startswith(prefix) or prefix.startswith("runs/")
    if parts[0] != "runs":
        return False
    rest = parts[2]
    if any(p.endswith("/") and rest.startswith(p) for p in JOB_PATHS):
        return False  # inside one job folder
    return any(p.startswith(rest) for p in JOB_PATHS)


class SidedStore:
    """An `ObjectStore` over two stores: each key goes to the store of its side; a listing that spans both
    sides is merged in key order."""

    def __init__(self, *, job: ObjectStore, orchestrator: ObjectStore) -> None:
        self.job = job
        self.orchestrator = orchestrator

    def side(self, key: str) -> ObjectStore:
        return self.job if side_of(key) == JOB else self.orchestrator

    def describe(self) -> str:
        return f"job side {self.job.describe()} + orchestrator side {self.orchestrator.describe()}"

    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> ObjectInfo:
        return self.side(key).put_bytes(key, data, if_none_match=if_none_match, if_match=if_match)

    def put_file(self, key: str, path: str | os.PathLike[str], *, sha256: str | None = None) -> ObjectInfo:
        return self.side(key).put_file(key, path, sha256=sha256)

    def get_bytes(self, key: str) -> bytes:
        return self.side(key).get_bytes(key)

    def download(self, key: str, path: str | os.PathLike[str]) -> None:
        self.side(key).download(key, path)

    def head(self, key: str) -> ObjectInfo | None:
        return self.side(key).head(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        if not _spans_both(prefix):
            yield from self.side(prefix).list(prefix)
            return
        # Each side lists only its own kinds: an object of the wrong side (written there before the split,
        # or by a job into a shared bucket) is never mistaken for the real one.
        job = (i for i in self.job.list(prefix) if side_of(i.key) == JOB)
        orch = (i for i in self.orchestrator.list(prefix) if side_of(i.key) == ORCHESTRATOR)
        yield from heapq.merge(job, orch, key=lambda i: i.key)

    def list_dirs(self, prefix: str) -> Iterator[str]:
        if not _spans_both(prefix):
            yield from self.side(prefix).list_dirs(prefix)
            return
        # A folder counts on a side only where that side's keys can lie, as in `list`.
        job = (d for d in self.job.list_dirs(prefix) if _spans_both(d) or side_of(d) == JOB)
        orch = (
            d for d in self.orchestrator.list_dirs(prefix) if _spans_both(d) or side_of(d) == ORCHESTRATOR
        )
        last = None
        for d in heapq.merge(job, orch):
            if d != last:
                yield d
            last = d

    def delete(self, key: str) -> None:
        self.side(key).delete(key)
