"""job_spec_for_run: the rendered launch script against golden files, and the spec's fields.

Regenerate the golden files after an intended change with LONGRUN_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from longrun.launch import NvrxLaunch, job_spec_for_run, run_dir_for
from longrun.runspec import Drill, RunSpec
from longrun.slurm.errors import InvalidSpecError
from longrun.slurm.render import render_sbatch
from longrun.slurm.spec import JobTag

from training import ports

GOLDEN = Path(__file__).parent / "golden"
TAG = JobTag(dag_id="training_run", run_id="manual__2026-11-29T16:00:00+00:00", task_id="submit")

CASES = {
    "cpu_crash_drill": dict(
        run=RunSpec(
            run_name="drill-crash",
            nodes=3,
            gpus_per_node=0,
            steps=30,
            checkpoint_every=10,
            drill=Drill(kind="crash", step=12, target="1"),
            max_restarts=2,
            time_limit_min=10,
        ),
        env={"AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "LONGRUN_BUCKET": "longrun"},
        nvrx=NvrxLaunch.for_step_time(0.5),
    ),
    "h100_relaunch": dict(
        run=RunSpec(
            run_name="llm-70b", nodes=16, gpus_per_node=8, steps=100_000, checkpoint_every=500
        ).relaunch(resume_from="runs/llm-70b/checkpoints/step-00012000/", exclude=("gpu-n017",)),
        env={"LONGRUN_STORE_DIR": "/shared/longrun-store", "NCCL_DEBUG": "WARN"},
        nvrx=None,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    c = CASES[case]
    spec = job_spec_for_run(c["run"], tag=TAG, run_dir_root="/shared/runs", env=c["env"], nvrx=c["nvrx"])
    text = render_sbatch(spec)
    path = GOLDEN / f"{case}.sbatch"
    if os.environ.get("LONGRUN_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


def test_script_is_valid_bash() -> None:
    for case in CASES:
        result = subprocess.run(
            ["bash", "-n", str(GOLDEN / f"{case}.sbatch")], capture_output=True, text=True
        )
        assert result.returncode == 0, (case, result.stderr)


def test_spec_fields_follow_the_run() -> None:
    run = RunSpec(run_name="r1", nodes=3, gpus_per_node=0, exclude=("n2",), max_restarts=4)
    spec = job_spec_for_run(run, tag=TAG, run_dir_root="/tmp/runs", env={}, python="/opt/venv/bin/python")
    assert (spec.nodes, spec.ntasks_per_node, spec.gpus_per_node, spec.exclusive) == (3, 1, 0, False)
    assert spec.exclude == ("n2",)
    assert spec.comment == TAG.render()
    script = render_sbatch(spec)
    assert "/opt/venv/bin/ft_launcher --nnodes=3 --nproc-per-node=1" in script
    assert "--max-restarts=4" in script
    assert "/opt/venv/bin/python -m training.nvrx launch-verdict" in script
    assert "--store" not in script  # no store configured: the run dir is the only evidence
    assert "--run-dir /tmp/runs/r1" in script


def test_gpu_run_owns_its_nodes() -> None:
    spec = job_spec_for_run(RunSpec(run_name="g", nodes=2), tag=TAG, run_dir_root="/runs", env={})
    assert spec.exclusive and spec.gpus_per_node == 8
    assert "--nproc-per-node=8" in render_sbatch(spec)


@pytest.mark.parametrize("root", ["relative/runs", "/runs/../etc", "/runs with space", "-x"])
def test_run_dir_root_is_checked(root: str) -> None:
    with pytest.raises(InvalidSpecError) as e:
        run_dir_for(RunSpec(run_name="r"), root)
    assert "run_dir_root" in str(e.value)


@pytest.mark.parametrize(
    ("field", "value"), [("safety_factor", 0.5), ("heartbeat_timeout_s", 0), ("monitor_interval_s", True)]
)
def test_nvrx_launch_validation_names_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidSpecError) as e:
        NvrxLaunch(**{field: value})
    assert field in str(e.value)


@pytest.mark.parametrize(
    ("job_id", "port"),
    # 23500 + id mod 7500; under the old rule (20000 + id mod 20000) 13020 drew 33020, in the ephemeral range
    [("41234", "27234"), ("13020", "29020"), ("12345678", "24178"), ("4294967294", "25794")],
)
def test_port_and_address_resolution_in_a_shell(tmp_path: Path, job_id: str, port: str) -> None:
    """The address/port lines of the script, run against a fake scontrol: NodeAddr of the FIRST node, and
    the rendezvous port in the default range (training.ports) for any job id."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "scontrol"
    fake.write_text(
        "#!/bin/bash\n"
        'if [ "$1 $2" = "show hostnames" ]; then printf "n2\\nn3\\n"; exit 0; fi\n'
        'if [ "$1 $2 $3 $4" = "-o show node n2" ]; then echo "NodeName=n2 Arch=x86_64 NodeAddr=127.0.0.2 NodeHostName=h"; fi\n'
    )
    fake.chmod(0o755)
    spec = job_spec_for_run(
        RunSpec(run_name="r", nodes=2, gpus_per_node=0), tag=TAG, run_dir_root=str(tmp_path), env={}
    )
    lines = [ln for ln in spec.command if "MASTER_" in ln or "FIRST_NODE=" in ln]
    script = "\n".join([*lines, 'echo "$MASTER_ADDR $MASTER_PORT"'])
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n[2-3]", "SLURM_JOB_ID": job_id}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split()[-2:] == ["127.0.0.2", port]
    assert str(ports.rendezvous_port(int(job_id))) == port


def test_cpu_runs_default_to_cpu_timeouts() -> None:
    cpu = job_spec_for_run(
        RunSpec(run_name="c", nodes=3, gpus_per_node=0), tag=TAG, run_dir_root="/r", env={}
    )
    gpu = job_spec_for_run(RunSpec(run_name="g", nodes=3), tag=TAG, run_dir_root="/r", env={})
    assert cpu.env["LONGRUN_NVRX_MIN_TIMEOUT_S"] == "60" and gpu.env["LONGRUN_NVRX_MIN_TIMEOUT_S"] == "300"
