"""A forged alert written into a clean run while it trains does not fail it (issue 28, item 4), on the real
four-node cluster: Slurm, srun, NVRx's ft_launcher, the reference trainer, the launch script's
`launch-verdict`, and the job's alert key exported by sbatch as the orchestrator does it.

Before: the launch wrapper counted the forged alerts as this launch's verdict and turned ft_launcher's
exit 0 into 93 (the monitor then failed the run: "exit 93 without an alert record").
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from longrun.launch import job_spec_for_run, run_dir_for
from longrun.runspec import RunSpec
from longrun.slurm import ops
from longrun.slurm.models import ACTIVE, JobStatus
from longrun.slurm.spec import JobTag

from training.events import write_durably
from training.records import schema, signing
from training.store.interface import put_json
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _forged(run: str, step: int, job_id: int) -> dict[str, dict]:
    alert = schema.record(
        "alert",
        run=run,
        step=step,
        check="finite",
        suspect_ranks=[1],
        suspect_nodes=["n2"],
        evidence={},
        time=time.time(),
    )
    return {
        "forged": signing.sign({**alert, "job_id": job_id}, signing.new_key()),
        "unsigned": {**alert, "job_id": job_id},
    }


def test_a_forged_alert_during_a_clean_run_leaves_it_clean(launcher) -> None:
    run = RunSpec(
        run_name="forged-alert",
        nodes=3,
        gpus_per_node=0,
        model="tiny",
        steps=100,
        checkpoint_every=10,
        recompute_every=5,
        vote_every=5,
        max_restarts=2,
        time_limit_min=10,
    )
    tag = JobTag(dag_id="tests_nvrx", run_id=run.run_name, task_id="launch")
    spec = job_spec_for_run(
        run,
        tag=tag,
        run_dir_root=str(launcher.root),
        env=launcher.env,
        nvrx=launcher.nvrx,
        python=sys.executable,
    )
    key = signing.new_key()
    job_id = launcher.client.submit(spec, secret_env={signing.KEY_ENV: key.hex()})
    launcher.jobs.append(job_id)
    run_dir = Path(run_dir_for(run, str(launcher.root)))
    store = LocalDirStore(launcher.env["LONGRUN_STORE_DIR"])
    # as soon as it trains, a job identity writes two forged alerts (run dir and store) naming this job
    deadline = time.monotonic() + 300
    while not (run_dir / schema.PROGRESS_PATH).exists():
        state = launcher.client.job(job_id)
        assert state.status in ACTIVE, f"the job ended before it trained: {state.describe()}"
        assert time.monotonic() < deadline, "the job did not train within 300 s"
        time.sleep(0.2)
    for name, alert in _forged(run.run_name, 7, job_id).items():
        relative = schema.alert_path(7, "finite", f"{name}-{job_id}")
        write_durably(run_dir / relative, alert)
        put_json(store, schema.store_key(run.run_name, relative), alert)
    state = ops.wait_for(launcher.client, job_id, lambda s: s.status not in ACTIVE, timeout_s=420, poll_s=1.0)
    out = launcher.root / f"{run.run_name}.slurm-{job_id}.out"
    log = out.read_text() if out.exists() else ""
    assert state.status is JobStatus.COMPLETED and state.exit_code == 0, log
    assert "SDC verdict in this launch" not in log
    assert log.count("is not this job's (") >= 4, log  # each forged one named (run dir and store)
