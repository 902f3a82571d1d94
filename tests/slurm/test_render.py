"""render_sbatch against golden files. Regenerate after an intended change with LONGRUN_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from longrun.slurm.render import render_sbatch
from longrun.slurm.spec import JobSpec

GOLDEN = Path(__file__).parent / "golden"

CASES = {
    "h100_default": JobSpec(
        name="train-llm",
        partition="gpu",
        nodes=16,
        command=["srun ft_launcher --nproc-per-node=8 --module training.train"],
        comment="longrun/training_run/manual__2026-11-29T15:00:00+00:00/submit/-1/1",
        time_limit_min=2 * 24 * 60 + 90,
        output="/shared/runs/demo/slurm-%j.out",
        workdir="/shared/runs/demo",
        env={"LONGRUN_RUN_NAME": "demo", "NCCL_DEBUG": "WARN"},
    ),
    "cpu_relaunch_excluding": JobSpec(
        name="train-cpu",
        partition="debug",
        nodes=3,
        gpus_per_node=0,
        exclusive=False,
        exclude=("n2",),
        requeue=False,
        time_limit_min=5,
        command=["srun bash -c 'echo rank $SLURM_NODEID on $SLURMD_NODENAME'", "exit 0"],
        comment="longrun/sdc_incident/scheduled__x/relaunch/-1/2",
    ),
    "diagnostic_in_reservation": JobSpec(
        name="longrun-diag",
        partition="debug",
        gpus_per_node=0,
        nodelist=("n2",),
        reservation="longrun_diag_n2_1764400000",
        time_limit_min=10,
        command=["python -m training.probe"],
        comment="longrun/sdc_incident/r1/diagnose/-1/1",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_golden(case):
    text = render_sbatch(CASES[case])
    path = GOLDEN / f"{case}.sbatch"
    if os.environ.get("LONGRUN_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


def test_always_append_requeue_explicit_and_tagged():
    for spec in CASES.values():
        text = render_sbatch(spec)
        assert "#SBATCH --open-mode=append\n" in text
        assert ("#SBATCH --requeue\n" in text) != ("#SBATCH --no-requeue\n" in text)
        assert f"#SBATCH --comment={spec.comment}\n" in text


def test_cpu_job_has_no_gres_and_gpu_job_has_h100_default():
    assert "--gres" not in render_sbatch(CASES["cpu_relaunch_excluding"])
    assert "#SBATCH --gres=gpu:h100:8\n" in render_sbatch(CASES["h100_default"])
    assert "#SBATCH --exclusive\n" in render_sbatch(CASES["h100_default"])


def test_directives_come_before_any_command():
    lines = render_sbatch(CASES["h100_default"]).splitlines()
    first_cmd = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert all(not line.startswith("#SBATCH") for line in lines[first_cmd:])
