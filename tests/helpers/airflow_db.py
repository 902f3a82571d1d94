"""Read-only looks into the session Airflow's metadata database, and its LocalExecutor workers.

The REST API answers in tens of milliseconds on a busy machine; a test that must act within the few
milliseconds between two state changes of a task instance reads the database directly (SQLite or
PostgreSQL, whatever the stack runs) instead. Nothing here writes to Airflow's database.
"""

from __future__ import annotations

import configparser
import os
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

WORKER_TITLE = "airflow worker -- LocalExecutor"


def engine(airflow_home: str | Path) -> sa.Engine:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(Path(airflow_home) / "airflow.cfg")
    url = cfg["database"]["sql_alchemy_conn"]
    args: dict[str, Any] = {"timeout": 5} if url.startswith("sqlite") else {"connect_timeout": 5}
    return sa.create_engine(url, connect_args=args, pool_size=1, max_overflow=0)


def ti_row(eng: sa.Engine, dag_id: str, run_id: str, task_id: str) -> dict[str, Any] | None:
    """state, try_number, id and pid of one task instance (map index -1), or None."""
    q = sa.text(
        "SELECT state, try_number, id, pid FROM task_instance"
        " WHERE dag_id = :d AND run_id = :r AND task_id = :t AND map_index = -1"
    )
    try:
        with eng.connect() as conn:
            row = conn.execute(q, {"d": dag_id, "r": run_id, "t": task_id}).mappings().first()
    except sa.exc.OperationalError:
        return None  # SQLite busy for a moment: not an answer, ask again
    return dict(row) if row else None


def events(eng: sa.Engine, dag_id: str, run_id: str, task_id: str, event: str) -> list[str]:
    """The `extra` text of each audit-log entry `event` for that task (e.g. "state mismatch")."""
    q = sa.text(
        "SELECT extra FROM log WHERE event = :e AND dag_id = :d AND run_id = :r AND task_id = :t ORDER BY id"
    )
    with eng.connect() as conn:
        return [str(r[0]) for r in conn.execute(q, {"e": event, "d": dag_id, "r": run_id, "t": task_id})]


def wait_state(
    eng: sa.Engine, dag_id: str, run_id: str, task_id: str, states: set[str], *, timeout: float, poll: float
) -> dict[str, Any] | None:
    """Poll (bounded) until the task instance is in one of `states`; the row then, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = ti_row(eng, dag_id, run_id, task_id)
        if row and row["state"] in states:
            return row
        time.sleep(poll)
    return None


def worker_running(ti_id: str) -> int | None:
    """PID of the LocalExecutor worker whose process title names this task instance (it sets the
    title to the workload's TI id while it supervises it, and back to `<idle>` after reporting)."""
    ti_id = str(uuid.UUID(str(ti_id)))  # SQLite keeps the id as 32 hex digits, the title has dashes
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if title.startswith(WORKER_TITLE) and ti_id in title:
            found.append((int(entry.name), ppid))
    pids = {pid for pid, _ in found}
    # The forked task process inherits the title; the worker is the one whose parent is not a match.
    top = [pid for pid, ppid in found if ppid not in pids]
    return top[0] if top else None


def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
