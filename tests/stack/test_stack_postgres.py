"""`longrun stack up --db postgres`: Airflow on a PostgreSQL server the stack starts itself, a DAG run
through it, and `down` leaves nothing of ours listening."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers.airflow_api import AirflowApi
from helpers.stack_fixtures import claim_port_base
from longrun.stack import procs
from longrun.stack.layout import Layout
from longrun.stack.postgres import IDLE_IN_TRANSACTION_TIMEOUT
from longrun.stack.stack import Stack

from .listening import listeners, process_group_pids

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


def _cli(state_dir: Path, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LONGRUN_STATE_DIR": str(state_dir)}
    return subprocess.run(
        [sys.executable, "-m", "longrun.cli", "stack", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_airflow_on_postgres_round_trip() -> None:
    # PostgreSQL runs as the postgres user when we are root: the state dir must be searchable by it
    # (pytest's own temp root is 0700).
    state = Path(tempfile.mkdtemp(prefix="lr-pg-"))
    state.chmod(0o711)
    base, lock = claim_port_base(state)
    Layout(state_dir=state, port_base=base).save()
    pgids: set[int] = set()
    try:
        up = _cli(state, "up", "--only", "airflow", "--db", "postgres", timeout=500)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "waiting for postgres" in up.stdout, up.stdout
        stack = Stack(state)
        assert stack.layout.db == "postgres"
        assert json.loads((state / "stack.json").read_text())["db"] == "postgres"
        cfg = (stack.airflow.home / "airflow.cfg").read_text()
        assert (
            "postgresql+psycopg2://longrun:" in cfg
            and f"127.0.0.1:{stack.layout.postgres_port}/airflow" in cfg
        )
        assert not (stack.airflow.home / "airflow.db").exists(), "Airflow must not fall back to SQLite"

        rows = {st.name: st for st in stack.status()}
        assert rows["postgres"].healthy, rows["postgres"]
        assert all(st.healthy for st in rows.values()), rows
        pgids = {st.pid for st in rows.values()}
        ours = process_group_pids(pgids)
        mine = sorted((s.address, s.port) for s in listeners() if set(s.pids) & ours)
        assert mine == sorted(
            [("127.0.0.1", stack.layout.airflow_port), ("127.0.0.1", stack.layout.postgres_port)]
        ), mine
        # No Unix socket in the shared /var/run/postgresql.
        assert not any(Path("/var/run/postgresql").glob(f".s.PGSQL.{stack.layout.postgres_port}*"))

        env = stack.env()
        api = AirflowApi.login(
            env["LONGRUN_AIRFLOW_URL"], env["LONGRUN_AIRFLOW_USER"], env["LONGRUN_AIRFLOW_PASSWORD"]
        )
        api.wait_dag_parsed("smoke", timeout=120, file_hint="smoke.py")
        api.unpause("smoke")
        run_id = api.trigger("smoke", conf={})
        assert api.wait_run("smoke", run_id, timeout=180) == "success", api.task_states("smoke", run_id)
        _killed_scheduler_leaves_no_session(stack)
        again = api.trigger("smoke", conf={})
        assert api.wait_run("smoke", again, timeout=180) == "success", api.task_states("smoke", again)

        down = _cli(state, "down", timeout=200)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "stopped postgres" in down.stdout, down.stdout
        assert not process_group_pids(pgids), "a process of the stack outlived `down`"
        ports = {stack.layout.airflow_port, stack.layout.postgres_port}
        assert not [s for s in listeners() if s.port in ports], "a port of ours still listens after down"
    finally:
        try:
            Stack(state).down(say=lambda _line: None)
        finally:
            lock.close()
            shutil.rmtree(state, ignore_errors=True)


def _scheduler_sessions(stack: Stack) -> set[int]:
    assert stack.airflow.db is not None
    out = stack.airflow.db.query(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'airflow-scheduler'"
    )
    return {int(p) for p in out.split()}


def _killed_scheduler_leaves_no_session(stack: Stack) -> None:
    """The attack: SIGKILL the scheduler. Its LocalExecutor workers, forked from it, live on and hold
    its database sessions (on PostgreSQL an open transaction keeps its row locks and every scheduler
    skips those DAG runs: a run stalls). The stack's restart must end them, and the database must end
    such a session on its own when no one does (idle_in_transaction_session_timeout)."""
    assert stack.airflow.db is not None
    setting = stack.airflow.db.query("SELECT current_setting('idle_in_transaction_session_timeout')")
    assert setting == IDLE_IN_TRANSACTION_TIMEOUT, setting
    rec = stack.airflow.live_record("scheduler")
    assert rec is not None
    before = _scheduler_sessions(stack)
    assert before, "the scheduler has no database session named airflow-scheduler (PGAPPNAME)"
    os.kill(rec.pid, signal.SIGKILL)
    procs.wait_for(lambda: not procs.alive(rec), what="scheduler death", timeout=10)
    orphans = procs.leftovers(rec)
    assert orphans, "no process outlived the scheduler: the attack did not happen"
    lines: list[str] = []
    stack.airflow.restart("scheduler", lines.append)
    assert any(f"dead scheduler (pid {rec.pid})" in line for line in lines), lines
    assert procs.leftovers(rec) == [], "the dead scheduler's workers still run"
    # PostgreSQL ends a backend when its client's socket closes: none of the old sessions is left.
    procs.wait_for(lambda: not (before & _scheduler_sessions(stack)), what="old sessions gone", timeout=30)
