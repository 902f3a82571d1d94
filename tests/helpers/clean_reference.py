"""A training run without a fault, launched straight on the session's cluster: the reference weights a drill
must end on.

A drill proves its recovery by ending on the same weights, bit for bit, as the same run without the
fault. That reference needs no orchestrator: it is the job `training_run` would submit for the same
Params (the same RunSpec, batch script and launcher settings, `longrun.monitor.lifecycle`), submitted
through the Slurm layer and waited for, as tests/nvrx launches its runs. Through Airflow the same run
costs a DAG run's tasks, the monitor's checkpoint gating and its settle hold on top of the job (about
60 s against 20 s on the CI host). The weights do not depend on the path: the launch record and the
store differ, the job and its training do not. Where the clean run through the DAG is itself what a
test checks, it still goes through Airflow (tests/e2e/test_drill.py's held job, tests/e2e/test_entrypoints.py).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrun.launch import job_spec_for_run, run_dir_for
from longrun.monitor import lifecycle
from longrun.slurm import ops
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.models import ACTIVE, JobStatus
from longrun.slurm.spec import JobTag

TIMEOUT_S = 600.0
"""Submit to end, bounded: about 20 s on an idle 2-core host, minutes on a loaded one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanRun:
    """What a clean run left: the fields a drill is compared on."""

    run_name: str
    job_id: int
    final_step: int
    """The report's final step (the run's `steps`)."""
    final_fingerprint: str
    """The report's fingerprint of the final weights."""


def launch_clean(slurm_conf: str, params: Mapping[str, Any], root: Path) -> CleanRun:
    """Run `params` (training_run's Params, no drill) as one Slurm job on the cluster of `slurm_conf`,
    with its run dir under `root` and a local store there; wait for it and read its report. Raises
    AssertionError, with the job's log, when the job does not complete or reports another step count."""
    spec = lifecycle.spec_from_params(params)
    if spec.drill is not None:
        raise ValueError(f"params must hold no drill: a clean run is the reference, got {spec.drill}")
    root.mkdir(parents=True, exist_ok=True)  # Slurm opens the job's log there before anything runs
    tag = JobTag(dag_id="tests_reference", run_id=spec.run_name, task_id="launch")
    job = job_spec_for_run(
        spec,
        tag=tag,
        run_dir_root=str(root),
        env={"LONGRUN_STORE_DIR": str(root / "store")},
        python=sys.executable,
    )
    client = CliSlurmClient(slurm_conf=slurm_conf)
    job_id = client.submit(job)
    state = ops.wait_for(client, job_id, lambda s: s.status not in ACTIVE, timeout_s=TIMEOUT_S, poll_s=1.0)
    run_dir = Path(run_dir_for(spec, str(root)))
    log = root / f"{spec.run_name}.slurm-{job_id}.out"
    tail = log.read_text()[-4000:] if log.exists() else f"(no log at {log})"
    if state.status is not JobStatus.COMPLETED:
        raise AssertionError(f"clean run {spec.run_name}: job {state.describe()}\n{tail}")
    report = json.loads((run_dir / "report.json").read_text())
    if report["final_step"] != spec.steps:
        raise AssertionError(f"clean run {spec.run_name} ended at step {report['final_step']}\n{tail}")
    return CleanRun(
        run_name=spec.run_name,
        job_id=job_id,
        final_step=int(report["final_step"]),
        final_fingerprint=str(report["final_fingerprint"]),
    )
