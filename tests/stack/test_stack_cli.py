"""`longrun stack up|status|env|down` round trip on a stack of its own (Slurm and S3; Airflow is
covered by the session stack in test_stack_airflow.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.stack_fixtures import claim_port_base
from longrun.stack.layout import SLOT_WIDTH, Layout
from longrun.stack.stack import Stack

from .listening import listeners, process_group_pids

pytestmark = [pytest.mark.slurm, pytest.mark.s3]


def _cli(state_dir: Path, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LONGRUN_STATE_DIR": str(state_dir)}
    return subprocess.run(
        [sys.executable, "-m", "longrun.cli", "stack", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def _parse_exports(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        assert line.startswith("export "), line
        key, _, value = line.removeprefix("export ").partition("=")
        (env[key],) = shlex.split(value)
    return env


@pytest.mark.parametrize(
    ("only", "processes"),
    [
        ("slurm,s3", 7),  # munged, slurmctld, 4 slurmd, weed
        pytest.param("slurm,s3,airflow", 11, marks=[pytest.mark.airflow, pytest.mark.slow]),
    ],
)
def test_round_trip(tmp_path_factory: pytest.TempPathFactory, only: str, processes: int) -> None:
    components = only.split(",")
    state = tmp_path_factory.mktemp("cli")
    base, lock = claim_port_base(state)
    # The CLI picks its ports from the state dir's saved layout.
    layout = Layout(state_dir=state, port_base=base)
    layout.save()
    pgids: set[int] = set()
    try:
        up = _cli(state, "up", "--only", only, timeout=400)
        assert up.returncode == 0, up.stdout + up.stderr
        for node in ("n1", "n2", "n3", "n4"):
            assert f"waiting for slurmd {node} ... ok" in up.stdout

        again = _cli(state, "up", "--only", only)
        assert again.returncode == 0, again.stderr
        assert "slurmctld: already running" in again.stdout
        assert "s3 (weed): already running" in again.stdout

        status = _cli(state, "status")
        assert status.returncode == 0, status.stdout
        assert [line[:4] for line in status.stdout.splitlines()] == ["ok  "] * processes, status.stdout

        env = _parse_exports(_cli(state, "env").stdout)
        assert env["SLURM_CONF"] == str(state / "slurm" / "slurm.conf")
        assert env["AWS_ENDPOINT_URL"] == layout.s3_endpoint
        assert env["LONGRUN_BUCKET"] == "longrun"
        assert len(env["AWS_SECRET_ACCESS_KEY"]) >= 30
        assert (state / "s3" / "credentials.json").stat().st_mode & 0o777 == 0o600
        assert (state / "munge" / "munge.key").stat().st_mode & 0o777 == 0o600
        if "airflow" in components:
            assert env["LONGRUN_AIRFLOW_URL"] == layout.airflow_url
            assert env["LONGRUN_AIRFLOW_USER"] == "admin"
            assert Stack(state).airflow.login_ok()

        stack = Stack(state)
        pgids.update(st.pid for st in stack.status())
        ours = process_group_pids(pgids)
        mine = [sock for sock in listeners() if set(sock.pids) & ours]
        assert {sock.port for sock in mine} == {p for c in components for p in layout.ports_of(c)}
        assert {sock.address for sock in mine} == {"127.0.0.1"}

        # A dead daemon shows in status (rc 1), and `up` repairs only that.
        stack.kill_slurmd("n4")
        dead = _cli(state, "status")
        assert dead.returncode == 1
        assert "DEAD slurm    slurmd-n4" in dead.stdout
        repaired = _cli(state, "up", "--only", "slurm")
        assert repaired.returncode == 0, repaired.stderr
        assert "waiting for slurmd n4 ... ok" in repaired.stdout
        assert "slurmd n1: already running" in repaired.stdout
    finally:
        pgids.update(st.pid for st in Stack(state).status())
        down = _cli(state, "down")
        try:
            # Checked while this session still holds the port range, so no other session can take it.
            assert down.returncode == 0, down.stdout + down.stderr
            assert not process_group_pids(pgids)
            assert not [s for s in listeners() if layout.port_base <= s.port < layout.port_base + SLOT_WIDTH]
            assert not [s for s in listeners() if s.port in layout.all_ports()]
        finally:
            lock.close()
    assert _cli(state, "status").stdout.startswith("nothing recorded")


def test_down_when_nothing_runs(tmp_path: Path) -> None:
    out = _cli(tmp_path, "down")
    assert out.returncode == 0, out.stderr


def test_bad_component_named(tmp_path: Path) -> None:
    out = _cli(tmp_path, "up", "--only", "slurm,kafka")
    assert out.returncode == 1
    assert "components must be a subset of slurm, s3, airflow, got ['slurm', 'kafka']" in out.stderr


def test_down_ends_running_jobs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A job still running at `down` does not outlive the cluster: slurmstepd daemonizes away from
    slurmd, so without this its steps (and their listening ports) would stay behind."""
    from longrun.stack.procs import job_step_tree

    state = tmp_path_factory.mktemp("jobs")
    base, lock = claim_port_base(state)
    Layout(state_dir=state, port_base=base).save()
    conf = str(state / "slurm" / "slurm.conf")
    try:
        up = _cli(state, "up", "--only", "slurm", timeout=400)
        assert up.returncode == 0, up.stdout + up.stderr
        env = {**os.environ, "SLURM_CONF": conf}
        sub = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-N2",
                f"--chdir={state}",
                "--output=/dev/null",
                "--wrap",
                "srun sleep 600",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert sub.returncode == 0, sub.stderr
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(job_step_tree(conf)) < 3:
            time.sleep(0.5)
        assert len(job_step_tree(conf)) >= 3, "the job's steps never started"
    finally:
        down = _cli(state, "down")
        lock.close()
    assert down.returncode == 0, down.stdout + down.stderr
    assert job_step_tree(conf) == []
