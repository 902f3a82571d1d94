"""DAG `checkpoint_audit`: it parses with the promised schedule and Params, and `dag.test()` runs the
audit, prints the Data Docs key, and fails without retries (naming the property and the runbook) when an
object was corrupted. Airflow runs in a subprocess with its own AIRFLOW_HOME."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"


def _airflow_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        PYTHONPATH=str(REPO / "tests"),
    )
    for name in ("AWS_ENDPOINT_URL", "LONGRUN_S3"):  # the audit must use the local store given here
        env.pop(name, None)
    return env


def test_dag_parses_with_schedule_and_params(tmp_path: Path) -> None:
    code = (
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"b = DagBag(dag_folder={str(DAGS / 'checkpoint_audit.py')!r})\n"
        "assert not b.import_errors, b.import_errors\n"
        "d = b.dags['checkpoint_audit']\n"
        "print(d.schedule, sorted(d.params), [t.task_id for t in d.tasks], d.tasks[0].retries)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=_airflow_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        out.stdout.strip().splitlines()[-1]
        == "@daily ['healthy_steps', 'loss_max', 'loss_min', 'runs', 'sample_size', 'seed'] ['audit'] 2"
    )


@pytest.mark.slow
def test_dag_runs_the_audit_and_fails_on_a_flipped_byte(tmp_path: Path) -> None:
    env = _airflow_env(tmp_path / "airflow")
    migrate = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("dag_runner.py")), str(DAGS), str(tmp_path / "store")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-5000:]
    assert "STATE 1 success" in log and "STATE 2 failed" in log, log[-5000:]
    assert "Data Docs: file://" in log and "/docs/index.html" in log
    assert "rehash_matches" in log and "runbooks/audit-failed.md" in log
    assert (tmp_path / "store" / "audit").is_dir()
    summaries = sorted((tmp_path / "store" / "audit").glob("*/summary.json"))
    assert len(summaries) == 2
