"""job_spec_for_run: the rendered launch script against golden files, and the spec's fields.

Regenerate the golden files after an intended change with LONGRUN_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from longrun import entrypoint as ep
from longrun.hotspare import step_script
from longrun.launch import JOB_EXPORT, job_spec_for_run, run_dir_for
from longrun.nvrx_launch import NvrxLaunch
from longrun.runspec import Drill, RunSpec
from longrun.slurm.errors import InvalidSpecError
from longrun.slurm.render import render_sbatch
from longrun.slurm.spec import JobTag

from training import ports

GOLDEN = Path(__file__).parent / "golden"
TAG = JobTag(dag_id="training_run", run_id="manual__2026-11-29T16:00:00+00:00", task_id="submit")

#: A hostile-but-valid argument list: spaces, both quotes, command substitutions, globs, a leading dash.
HOSTILE_ARGS = (
    "--data-dir",
    "/data/my corpus",
    'it\'s "quoted"',
    "$(touch /tmp/longrun-pwned)",
    "`id`",
    "a;b|c&&d",
    "*",
    "${HOME}",
    "",
    "-x",
)
ENTRYPOINT_DIR = "/shared/entrypoints"

CASES = {
    "cpu_crash_drill": lambda: dict(
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
    "h100_relaunch": lambda: dict(
        run=RunSpec(
            run_name="llm-70b", nodes=16, gpus_per_node=8, steps=100_000, checkpoint_every=500
        ).relaunch(resume_from="runs/llm-70b/checkpoints/step-00012000/", exclude=("gpu-n017",)),
        env={"LONGRUN_STORE_DIR": "/shared/longrun-store", "NCCL_DEBUG": "WARN"},
        nvrx=None,
    ),
    "script_entrypoint_args": lambda: dict(
        run=RunSpec(
            run_name="own-loop",
            nodes=2,
            gpus_per_node=8,
            steps=1000,
            checkpoint_every=100,
            entrypoint=f"script:{ENTRYPOINT_DIR}/gpt2/train.py",
            entrypoint_args=HOSTILE_ARGS,
        ),
        env={"LONGRUN_STORE_DIR": "/shared/longrun-store"},
        nvrx=None,
    ),
    "cpu_hot_spare_drill": lambda: dict(
        run=RunSpec(
            run_name="hs-drill",
            nodes=3,
            spare_nodes=1,
            gpus_per_node=0,
            steps=30,
            drill=Drill(kind="nan", step=12, target="n2"),
            entrypoint="module:my_pkg.train_ddp",
            entrypoint_args=("--lr", "3e-4"),
        ),
        env={"AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "LONGRUN_BUCKET": "longrun"},
        nvrx=NvrxLaunch.for_step_time(0.5),
    ),
}


@pytest.fixture(autouse=True)
def _site(monkeypatch: pytest.MonkeyPatch) -> None:
    """The site allows script entrypoints under ENTRYPOINT_DIR (a path that need not exist here)."""
    monkeypatch.setenv("LONGRUN_ENTRYPOINT_DIR", ENTRYPOINT_DIR)
    monkeypatch.delenv("LONGRUN_JOB_PYTHONS", raising=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    c = CASES[case]()
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
    assert "export LONGRUN_RUN_DIR=/tmp/runs/r1\n" in script
    assert script.rstrip().count("--module training.train\n") == 1, "the reference trainer gets no flags"


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


# ---- the entrypoint, its arguments and its environment, run through bash with fake Slurm commands -------

FAKE_SRUN = '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n'
FAKE_SCONTROL = (
    "#!/bin/bash\n"
    'if [ "$1 $2" = "show hostnames" ]; then echo n1; exit 0; fi\n'
    'echo "NodeName=$4 NodeAddr=127.0.0.1"\n'
)
#: ft_launcher: each argument NUL-terminated, then the job environment's names and values.
FAKE_LAUNCHER = (
    "#!/bin/bash\n"
    'printf "%s\\0" "$@" > "$OUT/argv"\n'
    'env | grep "^LONGRUN_" | grep -v "^LONGRUN_LAUNCH_T0=" | sort > "$OUT/env"\n'
)


def _fake_bin(tmp_path: Path) -> Path:
    """A bin dir with srun, scontrol, ft_launcher and a python whose launch-verdict finds no verdict."""
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    for name, text in (
        ("srun", FAKE_SRUN),
        ("scontrol", FAKE_SCONTROL),
        ("ft_launcher", FAKE_LAUNCHER),
        ("python", "#!/bin/bash\nexit 1\n"),
    ):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    return bindir


def _job_env(out: Path) -> dict[str, str]:
    """The LONGRUN_* variables ft_launcher saw, less NVRx's timeouts (NvrxLaunch.worker_env)."""
    pairs = (line.split("=", 1) for line in (out / "env").read_text().splitlines())
    return {k: v for k, v in pairs if not k.startswith("LONGRUN_NVRX_")}


def _argv(out: Path) -> list[str]:
    raw = (out / "argv").read_bytes()
    assert raw.endswith(b"\0")
    return raw[:-1].decode().split("\0")


def _after(argv: list[str], marker: str) -> list[str]:
    return argv[argv.index(marker) + 1 :]


def test_each_argument_arrives_as_one_literal_argv_entry(tmp_path: Path) -> None:
    """The whole rendered batch script, run by bash: the entrypoint's arguments reach ft_launcher exactly as
    given (nothing expanded, split or executed) and its environment is the contract's."""
    bindir, out = _fake_bin(tmp_path), tmp_path / "out"
    out.mkdir()
    script_path = f"{ENTRYPOINT_DIR}/gpt2/train.py"
    run = RunSpec(
        run_name="own-loop",
        nodes=1,
        gpus_per_node=0,
        steps=20,
        checkpoint_every=5,
        entrypoint=f"script:{script_path}",
        entrypoint_args=HOSTILE_ARGS,
        drill=Drill(kind="nan", step=3, target="0"),
    )
    spec = job_spec_for_run(run, tag=TAG, run_dir_root=str(tmp_path), env={}, python=str(bindir / "python"))
    (tmp_path / "job.sbatch").write_text(render_sbatch(spec))
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "OUT": str(out), "SLURM_JOB_ID": "41", "SLURM_NODEID": "0",
           "SLURM_JOB_NODELIST": "n1", "HOME": str(tmp_path)}  # fmt: skip
    done = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _after(_argv(out), "--ft-enable-nic-monitor=false") == [script_path, *HOSTILE_ARGS]
    assert not Path("/tmp/longrun-pwned").exists()
    assert _job_env(out) == {
        "LONGRUN_RUN_NAME": "own-loop",
        "LONGRUN_RUN_DIR": f"{tmp_path}/own-loop",
        "LONGRUN_STEPS": "20",
        "LONGRUN_CHECKPOINT_EVERY": "5",
        "LONGRUN_RECOMPUTE_EVERY": "5",
        "LONGRUN_VOTE_EVERY": "5",
        "LONGRUN_SEED": "1234",
        "LONGRUN_PARALLELISM": "ddp",
        "LONGRUN_FAULTS": "nan:3:0",  # no LONGRUN_MODEL: not the reference trainer
    }


def test_the_reference_trainer_gets_no_flags_and_a_relaunch_no_drill(tmp_path: Path) -> None:
    bindir, out = _fake_bin(tmp_path), tmp_path / "out"
    out.mkdir()
    first = RunSpec(run_name="ref", nodes=1, gpus_per_node=0, drill=Drill(kind="nan", step=3, target="0"))
    again = first.relaunch(resume_from="runs/ref/checkpoints/step-00000002/", exclude=("n9",))
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "OUT": str(out), "SLURM_JOB_ID": "42", "SLURM_NODEID": "0",
           "SLURM_JOB_NODELIST": "n1", "LONGRUN_FAULTS": "crash:1:0", "LONGRUN_AWAIT_DIRECTIVE_S": "9"}  # fmt: skip
    seen = {}
    for name, run in (("first", first), ("again", again)):
        spec = job_spec_for_run(
            run, tag=TAG, run_dir_root=str(tmp_path), env={}, python=str(bindir / "python")
        )
        (tmp_path / "job.sbatch").write_text(render_sbatch(spec))
        done = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert _after(_argv(out), "--ft-enable-nic-monitor=false") == ["--module", "training.train"]
        seen[name] = _job_env(out)
    assert seen["first"]["LONGRUN_MODEL"] == "tiny" and seen["first"]["LONGRUN_FAULTS"] == "nan:3:0"
    assert "LONGRUN_RESUME_FROM" not in seen["first"] and "LONGRUN_AWAIT_DIRECTIVE_S" not in seen["first"]
    assert "LONGRUN_FAULTS" not in seen["again"], "a relaunch never re-injects the drill"
    assert seen["again"]["LONGRUN_RESUME_FROM"] == "runs/ref/checkpoints/step-00000002/"


@pytest.mark.parametrize(
    ("attempt", "resume", "standby", "expect"),
    [
        ("0", "", None, {"LONGRUN_FAULTS": "nan:12:n2"}),
        ("0", "runs/hs/checkpoints/step-00000010/", None,
         {"LONGRUN_FAULTS": "nan:12:n2", "LONGRUN_RESUME_FROM": "runs/hs/checkpoints/step-00000010/"}),
        ("1", "runs/hs/checkpoints/step-00000010/", None, {"LONGRUN_RESUME_FROM": "runs/hs/checkpoints/step-00000010/"}),
        ("1", "", "330", {"LONGRUN_AWAIT_DIRECTIVE_S": "330"}),
        ("2", "", None, {}),
    ],
)  # fmt: skip
def test_the_hot_spare_step_sets_the_environment_per_attempt(
    tmp_path: Path, attempt: str, resume: str, standby: str | None, expect: dict[str, str]
) -> None:
    """The supervisor's step script (as the batch script hands it over) with the supervisor's variables:
    the drill only in attempt 0, the directed checkpoint as LONGRUN_RESUME_FROM, a standby's wait as
    LONGRUN_AWAIT_DIRECTIVE_S and never a resume point; the arguments one argv entry each."""
    bindir, out = _fake_bin(tmp_path), tmp_path / "out"
    out.mkdir()
    run = RunSpec(run_name="hs", nodes=1, spare_nodes=1, gpus_per_node=0, steps=30,
                  drill=Drill(kind="nan", step=12, target="n2"), entrypoint="module:my_pkg.train_ddp",
                  entrypoint_args=HOSTILE_ARGS)  # fmt: skip
    spec = job_spec_for_run(run, tag=TAG, run_dir_root=str(tmp_path), env={}, python=str(bindir / "python"))
    [line] = [ln for ln in spec.command if "-m training.spares.supervisor" in ln]
    words = shlex.split(line)  # what bash hands the supervisor
    step = words[words.index("--step") + 1]
    assert step == step_script(run, run_dir=f"{tmp_path}/hs", python=str(bindir / "python"),
                               launcher=str(bindir / "ft_launcher"), nvrx=NvrxLaunch.for_step_time(0.5),
                               store_flag="")  # fmt: skip
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "OUT": str(out), "SLURM_JOB_ID": "43", "SLURM_NODEID": "0",
           "LONGRUN_STEP_NODES": "n1", "LONGRUN_STEP_NNODES": "1", "LONGRUN_ATTEMPT": attempt,
           "LONGRUN_RESUME_FROM": resume, "LONGRUN_FAULTS": "crash:1:0", "LONGRUN_MODEL": "small"}  # fmt: skip
    if standby is not None:
        env["LONGRUN_STANDBY_WAIT_S"] = standby
    done = subprocess.run(["bash", "-c", step], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _after(_argv(out), "--ft-enable-nic-monitor=false") == [
        "--module",
        "my_pkg.train_ddp",
        *HOSTILE_ARGS,
    ]
    got = _job_env(out)
    for name in ("LONGRUN_ATTEMPT", "LONGRUN_STEP_NODES", "LONGRUN_STEP_NNODES", "LONGRUN_STANDBY_WAIT_S"):
        got.pop(name, None)  # the supervisor's own
    assert got == {
        "LONGRUN_RUN_NAME": "hs",
        "LONGRUN_RUN_DIR": f"{tmp_path}/hs",
        "LONGRUN_STEPS": "30",
        "LONGRUN_CHECKPOINT_EVERY": "10",
        "LONGRUN_RECOMPUTE_EVERY": "5",
        "LONGRUN_VOTE_EVERY": "5",
        "LONGRUN_SEED": "1234",
        "LONGRUN_PARALLELISM": "ddp",
        **expect,
    }


def test_the_job_environment_names_come_from_the_script_alone() -> None:
    assert "LONGRUN_FAULTS" in ep.JOB_ENV
    assert not set(ep.JOB_ENV) & set(JOB_EXPORT), "a LONGRUN_* setting must not pass from the Airflow worker"
    run = RunSpec(run_name="r", gpus_per_node=0)
    with pytest.raises(InvalidSpecError, match="LONGRUN_FAULTS"):
        job_spec_for_run(run, tag=TAG, run_dir_root="/r", env={"LONGRUN_FAULTS": "nan:1:0"})


def test_job_python_picks_the_interpreter_and_its_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGRUN_JOB_PYTHONS", "/opt/other/bin/python:/opt/job-venv/bin/python3")
    run = RunSpec(run_name="r", gpus_per_node=0, job_python="/opt/job-venv/bin/python3")
    script = render_sbatch(
        job_spec_for_run(run, tag=TAG, run_dir_root="/r", env={}, python="/airflow/bin/python")
    )
    assert "/opt/job-venv/bin/ft_launcher --nnodes=3" in script
    assert "/opt/job-venv/bin/python3 -m training.nvrx launch-verdict" in script and "/airflow/" not in script
