"""The fault matrix's two halves: where a drill is (a step, read from what the system already writes) and
what to break there (SIGKILL one component, then start it again).

Steps are recognised only from records and Slurm states (the store's alerts and incident records, Slurm's
node reasons, reservations and job tags, Airflow's task-instance rows): nothing in Airflow or longrun is
patched. Components are killed by the PIDs the stack recorded (or, for a task, the PID Airflow recorded
for its task process) and restarted the way `longrun stack up` starts them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from helpers import airflow_db
from longrun.dagrun_ids import attempt_run_id, incident_run_id
from longrun.slurm.client import SlurmClient
from longrun.stack import procs
from longrun.stack.stack import Stack

from training.records import schema
from training.store.interface import ObjectStore

AIRFLOW_DAEMONS = ("scheduler", "triggerer", "dag-processor")
COMPONENTS = (*AIRFLOW_DAEMONS, "task", "slurmctld", "slurmd", "s3")
TASK_WAIT_S = 180.0  # for a task process to start once its step is reached (a resumed deferred task)
STEPS = (
    "monitor",
    "hand_over",
    "freeze",
    "attribute",
    "drain",
    "diagnose",
    "pick",
    "relaunch",
    "reenter",
    "promotion",
)
# step -> the sdc_incident task that acts on it, for the steps whose task runs beside another one (attribute
# beside freeze, pick beside diagnose) or is reached while the task before it still runs (freeze: the
# incident record exists once open_record's first write is done, and open_record is still finishing): a
# "task" cell there kills that task's process, not any running task.
STEP_TASK = {"freeze": "freeze", "attribute": "attribute", "pick": "pick_checkpoint"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Where:
    """What a drill looks like from outside at one moment."""

    run: str
    store: ObjectStore
    client: SlurmClient
    db: sa.Engine


def _alerts(w: Where) -> list[str]:
    return [o.key for o in w.store.list(schema.store_key(w.run, "alerts/")) if o.key.endswith(".json")]


def _incident_ids(w: Where) -> list[str]:
    return [o.key for o in w.store.list(schema.store_key(w.run, "incidents/")) if o.key.endswith(".json")]


def _incident_run(w: Where) -> str | None:
    """The sdc_incident DAG run id of the run's (first) alert."""
    alerts = sorted(_alerts(w))
    return incident_run_id(alerts[0]) if alerts else None


def _timeline(w: Where) -> list[str]:
    """The event names on the run's (first) incident record's timeline."""
    keys = sorted(_incident_ids(w))
    if not keys:
        return []
    return [str(e.get("event")) for e in json.loads(w.store.get_bytes(keys[0])).get("timeline", ())]


def _task_started(task_id: str, event: str) -> Callable[[Where], bool]:
    """The incident's `task_id` runs now (its task instance is `running`), or already wrote `event` on the
    timeline (a short task can start and end between two looks)."""

    def reached(w: Where) -> bool:
        if event in _timeline(w):
            return True
        run_id = _incident_run(w)
        return run_id is not None and _ti_state(w, "sdc_incident", run_id, task_id) == "running"

    return reached


def _drained(w: Where) -> bool:
    return any((n.reason or "").startswith(f"longrun:sdc:{w.run}:") for n in w.client.nodes())


def _relaunch_jobs(w: Where) -> list[int]:
    return [
        j.job_id for j in w.client.jobs() if j.name == w.run and j.comment.startswith("longrun/sdc_incident/")
    ]


def _ti_state(w: Where, dag_id: str, run_id: str, task_id: str) -> str | None:
    row = airflow_db.ti_row(w.db, dag_id, run_id, task_id)
    return str(row["state"]) if row else None


def _first_monitor_deferred(w: Where) -> bool:
    """The first attempt's monitor waits in the triggerer and the trainer has made progress."""
    q = sa.text(
        "SELECT count(*) FROM task_instance WHERE dag_id = 'training_run' AND task_id = 'monitor'"
        " AND state = 'deferred' AND run_id NOT LIKE :attempt"
    )
    with w.db.connect() as conn:
        waiting = conn.execute(q, {"attempt": "%__attempt%"}).scalar()
    return bool(waiting) and w.store.head(schema.store_key(w.run, schema.PROGRESS_PATH)) is not None


def _unpromoted_relaunch_checkpoint(w: Where) -> bool:
    """The relaunch saved a checkpoint after its resume point that is not promoted yet: the monitor is
    about to validate and promote it."""
    from longrun.checkpoints import catalog

    keys = _incident_ids(w)
    if not keys or not _relaunch_jobs(w):
        return False
    rec = json.loads(w.store.get_bytes(keys[0]))
    pick = (rec.get("checkpoint") or {}).get("step")
    if pick is None:
        return False
    promoted = set(catalog.promoted_steps(w.store, w.run))
    steps = {
        s
        for o in w.store.list(schema.store_key(w.run, "checkpoints/"))
        if (s := schema.step_of_manifest_key(o.key))
    }
    return any(s > pick and s not in promoted for s in steps)


# step -> when the drill has reached it, from the outside
REACHED: dict[str, Callable[[Where], bool]] = {
    "monitor": _first_monitor_deferred,
    "hand_over": lambda w: bool(_alerts(w)),
    "freeze": lambda w: bool(_incident_ids(w)),
    "attribute": _task_started("attribute", "attributed"),
    "drain": _drained,
    "diagnose": lambda w: any(r.startswith("longrun_") for r in w.client.reservations()),
    "pick": _task_started("pick_checkpoint", "picked"),
    "relaunch": lambda w: bool(_relaunch_jobs(w)),
    "reenter": lambda w: _ti_state(w, "training_run", attempt_run_id(w.run, 1), "monitor") is not None,
    "promotion": _unpromoted_relaunch_checkpoint,
}


def wait_for_step(w: Where, step: str, *, timeout: float, poll: float = 0.2) -> float:
    """Block until the drill reached `step`; seconds waited. Raises TimeoutError (bounded)."""
    t0 = time.monotonic()
    check = REACHED[step]
    while time.monotonic() - t0 < timeout:
        try:
            if check(w):
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - a component we broke may not answer; look again
            pass
        time.sleep(poll)
    raise TimeoutError(f"run {w.run} never reached step {step!r} in {timeout:.0f} s")


class Breaker:
    """SIGKILL one component of the session's stack and start it again."""

    def __init__(self, stack: Stack, say: Callable[[str], None] = print) -> None:
        self.stack = stack
        self.say = say

    def kill(self, component: str, w: Where, *, node: str = "n1", step: str | None = None) -> int | None:
        """SIGKILL `component`; returns the PID killed (None when there was nothing to kill). For a task at
        a step in STEP_TASK, only that task's process is killed."""
        if component in AIRFLOW_DAEMONS:
            rec = self.stack.airflow.live_record(component)
        elif component == "slurmctld":
            rec = self.stack.slurm.live_record("slurmctld")
        elif component == "slurmd":
            rec = self.stack.slurm.live_record(f"slurmd-{node}")
        elif component == "s3":
            rec = self.stack.s3.live_record("weed")
        elif component == "task":
            return self._kill_task_when_running(w, task_id=STEP_TASK.get(step or ""))
        else:
            raise ValueError(f"component must be one of {COMPONENTS}, got {component!r}")
        if rec is None:
            return None
        os.kill(rec.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while procs.alive(rec) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.say(f"chaos: SIGKILL {component} (pid {rec.pid})")
        return rec.pid

    def _kill_task_when_running(
        self, w: Where, *, task_id: str | None = None, wait_s: float = TASK_WAIT_S, poll: float = 0.2
    ) -> int | None:
        """At a step a deferred task does between deferrals (promotion: the monitor resumes to validate and
        promote), no task process may run at the moment the step is seen: wait (bounded) for the one that
        acts on it to start, then kill it. With `task_id`, only the incident's task of that id."""
        t0 = time.monotonic()
        while True:
            try:
                pid = self._kill_running_task(w, task_id=task_id)
            except sa.exc.OperationalError:  # SQLite under load: "database is locked"; look again
                pid = None
            if pid is not None or time.monotonic() - t0 >= wait_s:
                if pid is not None and time.monotonic() - t0 >= 1.0:
                    self.say(f"chaos: waited {time.monotonic() - t0:.1f} s for a running task")
                return pid
            time.sleep(poll)

    def _kill_running_task(self, w: Where, *, task_id: str | None = None) -> int | None:
        """The task process of whichever longrun task of this run is running now (with `task_id`: that
        task of the run's incident)."""
        if task_id is None:
            q = sa.text(
                "SELECT dag_id, task_id, pid FROM task_instance WHERE state = 'running' AND pid IS NOT NULL"
                " AND dag_id IN ('training_run', 'sdc_incident')"
            )
            args: dict[str, str] = {}
        else:
            run_id = _incident_run(w)
            if run_id is None:
                return None
            q = sa.text(
                "SELECT dag_id, task_id, pid FROM task_instance WHERE state = 'running' AND pid IS NOT NULL"
                " AND dag_id = 'sdc_incident' AND run_id = :r AND task_id = :t"
            )
            args = {"r": run_id, "t": task_id}
        with w.db.connect() as conn:
            rows = list(conn.execute(q, args).mappings())
        for row in rows:
            pid = int(row["pid"])
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.say(f"chaos: SIGKILL task {row['dag_id']}.{row['task_id']} (pid {pid})")
            return pid
        return None

    def restart(self, component: str, *, node: str = "n1") -> None:
        """Start the component again (no-op for a task: Airflow's retry is its restart)."""
        if component in AIRFLOW_DAEMONS:
            # The stack's own restart: it first ends what the dead daemon left running (a scheduler's
            # LocalExecutor workers holding its database session and row locks).
            self.stack.airflow.restart(component, self.say)
        elif component == "slurmctld":
            self.stack.slurm.forget_dead()
            self.stack.slurm._start_ctld(self.say)
        elif component == "slurmd":
            self.stack.slurm.forget_dead()
            self.stack.slurm.restart_slurmd(node, self.say)
        elif component == "s3":
            self.stack.s3.forget_dead()
            self.stack.s3.up(self.say)
        self.say(f"chaos: {component} running again")

    def heal(self) -> None:
        """After a cell, whatever happened: every component of the stack runs again."""
        for component in (*AIRFLOW_DAEMONS, "slurmctld", "s3"):
            try:
                if component in AIRFLOW_DAEMONS:
                    alive = self.stack.airflow.live_record(component) is not None
                elif component == "slurmctld":
                    alive = self.stack.slurm.live_record("slurmctld") is not None
                else:
                    alive = self.stack.s3.live_record("weed") is not None
                if not alive:
                    self.restart(component)
            except Exception as e:  # noqa: BLE001 - report and go on healing the rest
                self.say(f"chaos: could not restart {component}: {e}")
        for node in ("n1", "n2", "n3", "n4"):
            try:
                self.stack.slurm.restart_slurmd(node, self.say)
            except Exception as e:  # noqa: BLE001
                self.say(f"chaos: could not restart slurmd {node}: {e}")
