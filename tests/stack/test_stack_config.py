"""Pure parts of the local stack: Slurm version detection, rendered configs, the port plan."""

from __future__ import annotations

import configparser
import os
import sys
from pathlib import Path

import pytest
from helpers.stack_fixtures import TEST_PORT_BASES
from longrun.stack import scheduler_preload
from longrun.stack.airflow import Airflow
from longrun.stack.airflow_cfg import render_airflow_cfg
from longrun.stack.layout import DEFAULT_PORT_BASE, HOST, NODES, SLOT_WIDTH, Layout
from longrun.stack.slurm_conf import render_cgroup_conf, render_slurm_conf
from longrun.stack.slurm_version import SlurmVersion, parse_version


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("slurm-wlm 22.05.8\n", SlurmVersion(major=22, minor=5, micro=8)),  # Debian 12
        ("slurm-wlm 24.11.5\n", SlurmVersion(major=24, minor=11, micro=5)),  # Debian 13
        ("slurm 23.02.7", SlurmVersion(major=23, minor=2, micro=7)),
        ("slurm 25.11.0-1", SlurmVersion(major=25, minor=11, micro=0)),
        ("slurm 24.05", SlurmVersion(major=24, minor=5, micro=0)),
    ],
)
def test_parse_version(text: str, expected: SlurmVersion) -> None:
    assert parse_version(text) == expected


def test_parse_version_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="no version number in 'slurmctld: command not found'"):
        parse_version("slurmctld: command not found")


@pytest.mark.parametrize(
    ("version", "needs"),
    [("22.05.8", False), ("23.11.10", False), ("24.05.0", True), ("24.11.5", True), ("25.11.2", True)],
)
def test_cgroup_conf_only_from_24_05(version: str, needs: bool) -> None:
    v = parse_version(version)
    assert v.needs_cgroup_conf is needs
    text = render_cgroup_conf(v)
    assert (text is not None and "CgroupPlugin=disabled" in text) is needs


def test_version_fields_validated() -> None:
    with pytest.raises(ValueError, match="minor must be a non-negative int, got -1"):
        SlurmVersion(major=22, minor=-1)


def _layout(tmp_path: Path, base: int = DEFAULT_PORT_BASE) -> Layout:
    return Layout(state_dir=tmp_path, port_base=base)


@pytest.mark.parametrize("version", ["22.05.8", "24.11.5"])
def test_slurm_conf(tmp_path: Path, version: str) -> None:
    layout = _layout(tmp_path)
    conf = render_slurm_conf(layout, hostname="box", version=parse_version(version))
    lines = conf.splitlines()
    assert f"SlurmctldHost=box({HOST})" in lines
    assert f"AuthInfo=socket={tmp_path / 'munge' / 'munge.socket'}" in lines
    assert "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in lines
    assert "SchedulerParameters=batch_sched_delay=0" in lines
    assert f"JobCompLoc={tmp_path / 'slurm' / 'jobcomp.txt'}" in lines
    assert f"SrunPortRange={DEFAULT_PORT_BASE + 100}-{DEFAULT_PORT_BASE + SLOT_WIDTH - 1}" in lines
    # Several slurmd on one host need per-node paths.
    assert sum("%n" in line for line in lines) == 3
    for node in NODES:
        assert any(
            line.startswith(
                f"NodeName={node} NodeHostname=box NodeAddr={HOST} Port={layout.slurmd_port(node)}"
            )
            for line in lines
        )
    assert f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP" in lines
    # Every path lies in the state dir.
    for line in lines:
        if "=/" in line:
            assert str(tmp_path) in line, line


def test_port_plan_fits_one_slot(tmp_path: Path) -> None:
    for base in (DEFAULT_PORT_BASE, *TEST_PORT_BASES):
        layout = _layout(tmp_path, base)
        ports = layout.all_ports()
        assert len(ports) == len(set(ports))
        plain = [p for p in ports if p < base + 10000]
        assert all(base <= p < base + SLOT_WIDTH for p in plain)
        assert not set(range(*layout.srun_port_range)) & set(ports)
        # Below Linux's ephemeral range, where outgoing connections take their ports.
        assert max(ports) < 32768


def test_layout_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="port_base must be in 1024..55335, got 80"):
        Layout(state_dir=tmp_path, port_base=80)
    with pytest.raises(ValueError, match="bucket must be a valid S3 bucket name .* got 'No_Such'"):
        Layout(state_dir=tmp_path, bucket="No_Such")
    with pytest.raises(ValueError, match="state_dir must be absolute, got 'rel'"):
        Layout(state_dir=Path("rel"))


def test_layout_is_remembered(tmp_path: Path) -> None:
    Layout(state_dir=tmp_path, port_base=23000, bucket="other").save()
    again = Layout.load(tmp_path)
    assert (again.port_base, again.bucket) == (23000, "other")


def _airflow_cfg(layout: Layout, tmp_path: Path) -> configparser.ConfigParser:
    text = render_airflow_cfg(
        layout=layout,
        home=tmp_path / "airflow",
        dags=tmp_path / "dags",
        plugins=tmp_path / "plugins",
        secrets_={"fernet_key": "f", "api_secret_key": "a", "jwt_secret": "j"},
    )
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(text)
    return cfg


def test_airflow_cfg(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    cfg = _airflow_cfg(layout, tmp_path)
    assert cfg["api"]["host"] == HOST
    assert cfg["api"]["port"] == str(layout.airflow_port)
    assert cfg["core"]["execution_api_server_url"] == f"http://{HOST}:{layout.airflow_port}/execution/"
    assert cfg["core"]["load_examples"] == "False"
    assert cfg["core"]["parallelism"] == "4"
    assert cfg["core"]["executor"] == "LocalExecutor"
    assert cfg["database"]["sql_alchemy_conn"].startswith("sqlite:///")
    assert int(cfg["dag_processor"]["refresh_interval"]) <= 10
    # A changed DAG file is parsed again at once (not after min_file_process_interval) only when the
    # queue is sorted by modification time.
    assert cfg["dag_processor"]["file_parsing_sort_mode"] == "modified_time"
    # One JWT secret for all components, else task tokens signed by one are refused by another.
    assert cfg["api_auth"]["jwt_secret"] == "j"
    # A killed scheduler's tasks are reset within about a minute, not Airflow's default five.
    assert float(cfg["scheduler"]["orphaned_tasks_check_interval"]) <= 60
    # DAGs run on their schedules unless the layout says not (a test session's stack).
    assert cfg["scheduler"].getboolean("use_job_schedule", fallback=True)


def test_a_stack_without_schedules(tmp_path: Path) -> None:
    Layout(state_dir=tmp_path, schedules=False).save()
    layout = Layout.load(tmp_path)
    assert layout.schedules is False
    cfg = _airflow_cfg(layout, tmp_path)
    assert cfg["scheduler"].getboolean("use_job_schedule") is False
    with pytest.raises(ValueError, match="schedules"):
        Layout(state_dir=tmp_path, schedules="no")  # type: ignore[arg-type]


def test_preload_torch_is_remembered_and_off_by_default(tmp_path: Path) -> None:
    assert Layout.load(tmp_path).preload_torch is False
    Layout(state_dir=tmp_path, preload_torch=True).save()
    assert Layout.load(tmp_path).preload_torch is True
    with pytest.raises(ValueError, match="preload_torch"):
        Layout(state_dir=tmp_path, preload_torch="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("preload_torch", [True, False])
def test_local_settings_follow_preload_torch(tmp_path: Path, preload_torch: bool) -> None:
    # A stale copy from an earlier start with the option on is removed when it is off.
    airflow = Airflow(Layout(state_dir=tmp_path, preload_torch=preload_torch))
    stale = airflow.home / "config" / "airflow_local_settings.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("stale\n")
    airflow._write_config()
    if preload_torch:
        assert stale.read_text() == Path(scheduler_preload.__file__).read_text()
    else:
        assert not stale.exists()


def test_preload_imports_what_the_variable_names_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lr_preload_probe.py").write_text(
        "import os\nBLAS = os.environ.get('OPENBLAS_NUM_THREADS')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lr_preload_probe", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv(scheduler_preload.PRELOAD_ENV, "lr_preload_probe, json")
    assert scheduler_preload.preload() == ["lr_preload_probe", "json"]
    # Imported with numpy's BLAS at one thread; both variables are gone again, so the programs the
    # scheduler's tasks start (an `airflow` command) neither import again nor inherit the BLAS limit.
    assert sys.modules["lr_preload_probe"].BLAS == "1"
    assert scheduler_preload.PRELOAD_ENV not in os.environ
    assert "OPENBLAS_NUM_THREADS" not in os.environ
    assert scheduler_preload.preload() == []
    # A BLAS setting of the environment's own is kept.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setenv(scheduler_preload.PRELOAD_ENV, "json")
    assert scheduler_preload.preload() == ["json"]
    assert os.environ["OPENBLAS_NUM_THREADS"] == "2"


def test_each_stack_puts_run_dirs_under_its_own_state_dir(tmp_path: Path, monkeypatch) -> None:
    """Two stacks on one machine never share a run dir, even for runs of the same name (two test sessions
    started in the same second once named theirs alike); the daemons and a shell from `stack env` agree,
    and a root exported before `stack up` does not leak into the stack's workers."""
    monkeypatch.setenv("LONGRUN_RUN_ROOT", str(tmp_path / "shared"))
    roots = []
    for name in ("a", "b"):
        airflow = Airflow(Layout(state_dir=tmp_path / name))
        airflow.password()
        assert airflow.daemon_env()["LONGRUN_RUN_ROOT"] == airflow.env()["LONGRUN_RUN_ROOT"]
        roots.append(Path(airflow.env()["LONGRUN_RUN_ROOT"]))
    assert roots == [tmp_path / "a" / "runs", tmp_path / "b" / "runs"]
