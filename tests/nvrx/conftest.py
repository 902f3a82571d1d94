"""Fixtures for the NVRx tests on the four-node cluster: launch a RunSpec through longrun.launch and the
Slurm layer, wait for the job, and read back what the run left (records, log, the job's final state)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from longrun.launch import job_spec_for_run, run_dir_for
from longrun.nvrx_launch import NvrxLaunch
from longrun.runspec import RunSpec
from longrun.slurm import ops
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.models import ACTIVE, JobState
from longrun.slurm.outcomes import Outcome, classify
from longrun.slurm.spec import JobTag

JOB_TIMEOUT_S = 420
#: Tiny runs on this 2-core machine: ~0.1-0.5 s a step, ~20 s to start the ranks.
STEP_S = 0.5


@dataclass
class Launched:
    """One finished launch."""

    run: RunSpec
    job_id: int
    state: JobState
    outcome: Outcome
    run_dir: Path
    log: str
    wall_s: float

    def report(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "report.json").read_text())

    def progress(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "progress" / "latest.json").read_text())

    def alerts(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.run_dir / "alerts").glob("*.json"))]

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log, flags=re.M))


@dataclass
class Launcher:
    """Submits runs to the session's cluster; cancels whatever it submitted at teardown."""

    client: CliSlurmClient
    root: Path
    env: dict[str, str]
    nvrx: NvrxLaunch
    jobs: list[int] = field(default_factory=list)

    def launch(
        self, run: RunSpec, *, timeout_s: float = JOB_TIMEOUT_S, nvrx: NvrxLaunch | None = None
    ) -> Launched:
        """Submit `run` and wait for its end; `nvrx` replaces the module's ft_launcher settings for it."""
        import time

        tag = JobTag(dag_id="tests_nvrx", run_id=run.run_name, task_id="launch")
        spec = job_spec_for_run(
            run,
            tag=tag,
            run_dir_root=str(self.root),
            env=self.env,
            nvrx=nvrx or self.nvrx,
            python=sys.executable,
        )
        t0 = time.monotonic()
        job_id = self.client.submit(spec)
        self.jobs.append(job_id)
        state = ops.wait_for(
            self.client, job_id, lambda s: s.status not in ACTIVE, timeout_s=timeout_s, poll_s=1.0
        )
        wall = time.monotonic() - t0
        out = self.root / f"{run.run_name}.slurm-{job_id}.out"
        return Launched(
            run=run,
            job_id=job_id,
            state=state,
            outcome=classify(state),
            run_dir=Path(run_dir_for(run, str(self.root))),
            log=out.read_text() if out.exists() else "",
            wall_s=wall,
        )

    def cancel_all(self) -> None:
        for job_id in self.jobs:
            try:
                self.client.cancel(job_id)
            except Exception:  # already gone
                pass


@pytest.fixture(scope="module")
def launcher(slurm_cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    root = tmp_path_factory.mktemp("nvrx-runs")
    conf = slurm_cluster.env["SLURM_CONF"]
    # Give each session's rendezvous a port range of its own, derived from the session's (disjoint) stack
    # port range, on top of the per-slot job id windows (longrun.stack.slurm_conf.first_job_id).
    base = slurm_cluster.stack.layout.port_base - 12000
    nvrx = dataclasses.replace(NvrxLaunch.for_step_time(STEP_S), port_base=base, port_span=150)
    env = {"SLURM_CONF": conf, "LONGRUN_STORE_DIR": str(root / "store"), "OMP_NUM_THREADS": "1"}
    lau = Launcher(client=CliSlurmClient(slurm_conf=conf), root=root, env=env, nvrx=nvrx)
    try:
        yield lau
    finally:
        lau.cancel_all()
