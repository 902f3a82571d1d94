"""Fixtures for the Slurm tests: a client per backend present, and two layers that undo what a test did.

- `guard` (per test that asks for it): cancels every job the test submitted, resumes nodes drained by
  longrun, deletes longrun's reservations and undoes the foreign drains the test made on purpose.
- `clean_cluster` (autouse, every test that uses the session's cluster): checks the cluster is clean
  before the test (every node idle without flags, no reservation, no active job) and restores exactly that
  afterwards, also when the test or the guard failed, through Slurm's own commands, so a failing test (or a
  broken backend under test) cannot leave drained nodes or reservations behind for the next test.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.cluster_state import restore_clean_cluster
from helpers.pyslurm_required import skip_without_pyslurm
from longrun.slurm import pyslurm_backend, pyslurm_loader
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.client import SlurmClient
from longrun.slurm.spec import JobSpec

BACKENDS = ["cli", "pyslurm"]


def make(backend: str, slurm_conf: str) -> SlurmClient:
    cli = CliSlurmClient(slurm_conf=slurm_conf)
    if backend == "cli":
        return cli
    reason = pyslurm_loader.unavailable_reason(cluster_version=cli.version(), slurm_conf=slurm_conf)
    if reason:
        skip_without_pyslurm(f"pyslurm backend: {reason}")
    return pyslurm_backend.PyslurmClient(slurm_conf=slurm_conf)


@dataclass
class Guard:
    """What a test changed on the cluster, undone at teardown."""

    client: SlurmClient
    slurm_conf: str
    partition: str
    workdir: str
    jobs: list[int] = field(default_factory=list)
    foreign_drained: list[str] = field(default_factory=list)

    def spec(self, name: str, command: list[str], **kw) -> JobSpec:
        """A small CPU job spec for this cluster, logging into the test's tmp dir."""
        base = dict(
            name=name,
            partition=self.partition,
            gpus_per_node=0,
            exclusive=False,
            time_limit_min=5,
            workdir=self.workdir,
            output=f"{self.workdir}/slurm-%j.out",
            comment=f"longrun/test/{name}/t/-1/1",
            command=command,
        )
        return JobSpec(**{**base, **kw})

    def submit(self, spec: JobSpec) -> int:
        job_id = self.client.submit(spec)
        self.jobs.append(job_id)
        return job_id

    def scontrol(self, *args: str) -> None:
        env = {**os.environ, "SLURM_CONF": self.slurm_conf}
        subprocess.run(["scontrol", *args], env=env, check=True, capture_output=True, timeout=30)

    def drain_foreign(self, node: str, reason: str) -> None:
        """Drain as an admin would (not through longrun), remembered for teardown."""
        self.foreign_drained.append(node)
        self.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def output(self, job_id: int) -> str:
        path = Path(self.workdir) / f"slurm-{job_id}.out"
        return path.read_text() if path.exists() else ""

    def teardown(self) -> None:
        # Through the backend under test (part of its contract); `clean_cluster` repairs what this misses.
        for job_id in self.jobs:
            self.client.cancel(job_id)
        for name in self.client.reservations():
            if name.startswith("longrun_"):
                self.client.delete_reservation(name)
        for node in self.foreign_drained:
            self.scontrol("update", f"NodeName={node}", "State=RESUME")
        deadline = time.monotonic() + 30
        for state in self.client.nodes():
            if state.drain_flag and state.is_ours:
                self.client.resume(state.name)
        # Wait until every node takes jobs again, so the next test starts from an idle cluster.
        while time.monotonic() < deadline:
            states = self.client.nodes()
            if not any(s.drain_flag or s.is_down for s in states):
                return
            time.sleep(0.5)


@pytest.fixture(autouse=True)
def clean_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    if "slurm_cluster" not in request.fixturenames:
        yield
        return
    cluster = request.getfixturevalue("slurm_cluster")
    left = restore_clean_cluster(cluster)
    if left:
        pytest.fail(f"the Slurm cluster is not clean before the test and could not be restored: {left}")
    try:
        yield
    finally:
        left = restore_clean_cluster(cluster)
        if left:
            pytest.fail(f"the Slurm cluster could not be restored after the test: {left}")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def guard(slurm_cluster, backend: str, tmp_path) -> Iterator[Guard]:
    conf = slurm_cluster.env["SLURM_CONF"]
    g = Guard(
        client=make(backend, conf), slurm_conf=conf, partition=slurm_cluster.partition, workdir=str(tmp_path)
    )
    try:
        yield g
    finally:
        g.teardown()
