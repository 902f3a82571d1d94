"""A CLI Slurm client for one test that records the jobs it submits (`client.test_jobs`) and, on leaving,
cancels them (waiting until they end) and resumes the nodes longrun drained: the cluster as it was found.
Reservations are left to the caller, which either deletes longrun's or asserts none was left."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from longrun.slurm import ops
from longrun.slurm.client import SlurmClient
from longrun.slurm.factory import make_client


@contextmanager
def tracked_client(slurm_conf: str) -> Iterator[SlurmClient]:
    c = make_client(backend="cli", slurm_conf=slurm_conf)
    jobs: list[int] = []
    c.test_jobs = jobs  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        for job_id in jobs:
            c.cancel(job_id)
            ops.wait_for(c, job_id, lambda s: s.is_terminal, timeout_s=60)
        for n in c.nodes():
            if n.drain_flag and n.is_ours:
                c.resume(n.name)
