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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from helpers import airflow_db
from longrun.dagrun_ids import attempt_run_id, incident_run_id
from longrun.slurm import parse
from longrun.slurm.client import SlurmClient
from longrun.stack import procs
from longrun.stack.stack import Stack

from training.records import schema
from training.store.interface import ObjectStore

from .grid import AIRFLOW_DAEMONS, COMPONENTS, NEXT

TASK_WAIT_S = 180.0  # for a task process to start once its step is reached (a resumed deferred task)
# step -> the sdc_incident task that acts on it, for the steps whose task runs beside another one (attribute
# beside freeze, pick beside diagnose, the hot-spare relaunch waiting for the job's supervisor beside
# diagnose) or is reached while the task before it still runs (freeze: the incident record exists once
# open_record's first write is done, and open_record is still finishing): a "task" cell there kills that
# task's process, not any running task.
STEP_TASK = {
    "freeze": "freeze",
    "attribute": "attribute",
    "pick": "pick_checkpoint",
    "spare_directive": "relaunch",
}


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
    # the hot-spare row (grid.SPARE_STEPS): recovery inside the kept job, from the incident's timeline
    "spare_directive": lambda w: "directive_written" in _timeline(w),
    "spare_running": lambda w: "relaunched_running" in _timeline(w),
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


def next_steps_begun(w: Where, step: str) -> dict[str, bool | None]:
    """For each step that begins only after `step` ended (grid.NEXT), whether it has begun now, by the same
    recognition as `wait_for_step` (REACHED); None where the look failed (a component we broke may not
    answer: S3 for the store's records, slurmctld for Slurm's states)."""
    looks: dict[str, bool | None] = {}
    for later in NEXT[step]:
        try:
            looks[later] = bool(REACHED[later](w))
        except Exception:  # noqa: BLE001 - unknown, not "not begun"
            looks[later] = None
    return looks


def next_steps_within(w: Where, step: str, wait_s: float) -> dict[str, bool | None]:
    """`next_steps_begun`, taking `wait_s` seconds whatever it costs: a look that has not answered by then
    (a store client retrying against a killed S3) counts as unknown, so the look never stretches the time
    the killed component stays down. Used as the pause between a kill and the restart."""
    box: dict[str, bool | None] = {}
    t0 = time.monotonic()
    looker = threading.Thread(target=lambda: box.update(next_steps_begun(w, step)), daemon=True)
    looker.start()
    looker.join(wait_s)
    looks = dict(box) if not looker.is_alive() else dict.fromkeys(NEXT[step])
    time.sleep(max(0.0, wait_s - (time.monotonic() - t0)))
    return looks


def at_kill(before: dict[str, bool | None], after: dict[str, bool | None]) -> dict[str, bool | None]:
    """The later steps as they were when the kill landed, from a look just before it and one just after:
    begun if either look saw it begun (a step never un-begins, and one begun before the kill had begun at
    it); otherwise what the look after the kill saw (False, or None when that look failed: a look before
    can be long before a task kill, which waits for its task process, so its False proves nothing)."""
    return {s: True if before.get(s) is True or after.get(s) is True else after.get(s) for s in after}


def begun(looks: dict[str, bool | None]) -> bool | None:
    """Whether a later step had begun: True if any had, False if every look says none had, None when a
    look failed and none saw one begun (also when `looks` is empty: no later step is recognised)."""
    if any(v is True for v in looks.values()):
        return True
    if looks and all(v is False for v in looks.values()):
        return False
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """The nodes one job of the run was given (`active`: it runs now)."""

    job_id: int
    nodes: tuple[str, ...]
    active: bool
    state: str = ""
    """Slurm's state as last seen (squeue for a running job, the jobcomp line for a finished one)."""


def run_allocations(w: Where, jobcomp: Path | None) -> list[Allocation]:
    """The run's jobs, oldest first: the ones Slurm runs now, and the finished ones of its jobcomp file."""
    active = {j.job_id: j for j in w.client.jobs() if j.name == w.run and j.is_active}
    done = {}
    if jobcomp is not None and jobcomp.exists():
        with jobcomp.open() as fh:
            done = {i: j for i, j in parse.jobs_from_jobcomp(fh).items() if j.name == w.run}
    seen = {**done, **active}
    return [
        Allocation(job_id=i, nodes=tuple(j.nodes), active=i in active, state=j.slurm_state)
        for i, j in sorted(seen.items())
    ]


def choose_slurmd(allocations: list[Allocation], *, target: str) -> tuple[str, str]:
    """The node whose slurmd a "slurmd" cell kills, and why: a node of the run's allocation at the kill
    (the newest running job's), other than the drill's target if it has another, so that the kill hits a
    node that holds a rank of the run. Between jobs (the first one ended, the relaunch not yet started)
    the newest finished job's allocation; with no job of the run at all, n1 as before (said so)."""
    running = [a for a in allocations if a.active and a.nodes]
    finished = [a for a in allocations if not a.active and a.nodes]
    for group, how in ((running, "running"), (finished, "finished, none running")):
        if not group:
            continue
        alloc = group[-1]
        others = sorted(n for n in alloc.nodes if n != target)
        node = others[0] if others else target
        why = f"allocation of job {alloc.job_id} ({how}): {','.join(alloc.nodes)}"
        return node, why + ("" if others else f"; only the target {target} in it")
    return "n1", "no job of the run known to Slurm: n1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Kill:
    """What a cell killed: the PID, the process's name (the stack's record name, or the task's
    `<dag>.<task>`), the node (slurmd only) and when the SIGKILL was sent (epoch seconds)."""

    pid: int
    name: str
    time: float
    node: str | None = None


class Breaker:
    """SIGKILL one component of the session's stack and start it again."""

    def __init__(self, stack: Stack, say: Callable[[str], None] = print) -> None:
        self.stack = stack
        self.say = say
        self.last_kill: Kill | None = None
        """The last kill this breaker made (None before the first, or when there was nothing to kill)."""

    def kill(
        self, component: str, w: Where, *, node: str | None = None, step: str | None = None
    ) -> int | None:
        """SIGKILL `component`; returns the PID killed (None when there was nothing to kill) and keeps what
        it killed in `last_kill`. For a task at a step in STEP_TASK, only that task's process is killed;
        for slurmd, `node`'s (required: the cell chooses it, `choose_slurmd`)."""
        self.last_kill = None
        if component == "slurmd" and node is None:
            raise ValueError("a slurmd kill needs its node (choose_slurmd)")
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
        self.last_kill = Kill(pid=rec.pid, name=rec.name, time=time.time(), node=node)
        deadline = time.monotonic() + 10
        while procs.alive(rec) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.say(f"chaos: SIGKILL {component}{f' on {node}' if node else ''} (pid {rec.pid})")
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
            self.last_kill = Kill(pid=pid, name=f"{row['dag_id']}.{row['task_id']}", time=time.time())
            self.say(f"chaos: SIGKILL task {row['dag_id']}.{row['task_id']} (pid {pid})")
            return pid
        return None

    def restart(self, component: str, *, node: str | None = None) -> None:
        """Start the component again (no-op for a task: Airflow's retry is its restart); for slurmd,
        `node`'s (the node the kill named)."""
        if component in AIRFLOW_DAEMONS:
            # The stack's own restart: it first ends what the dead daemon left running (a scheduler's
            # LocalExecutor workers holding its database session and row locks).
            self.stack.airflow.restart(component, self.say)
        elif component == "slurmctld":
            self.stack.slurm.forget_dead()
            self.stack.slurm._start_ctld(self.say)
        elif component == "slurmd":
            self.stack.slurm.forget_dead()
            if node is None:
                raise ValueError("a slurmd restart needs its node")
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
