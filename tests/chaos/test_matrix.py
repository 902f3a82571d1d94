"""The fault matrix (issue 14): a sick-node drill on the real stack, one component SIGKILLed at one step of
`training_run`'s monitor or of `sdc_incident`, then started again; the incident must still end exactly
once: relaunched once, one drain-ledger entry, the node drained with longrun's reason, one relaunched
job, and final weights bit-identical to a clean run's.

Each cell is (step, component). The step is recognised from the store's records and Slurm's states
(tests/chaos/harness.py), never by patching Airflow. Each cell writes its artefact whatever happens in
its body (tests/chaos/artefact.py: docs/reliability/cells/<database>--<step>--<component>.json), and
docs/reliability.md's table is generated from those (scripts/reliability_table.py). A cell whose kill
landed after a later step had begun is "missed": its artefact says so and pytest reports it skipped.
Run: `make test-chaos` (LONGRUN_TEST_DB=postgres for PostgreSQL); LONGRUN_CHAOS=rotate runs only this
commit's two cells (tests/chaos/rotation.py).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict
from typing import Any

import pytest
from helpers import airflow_db
from helpers.cleanup import fail_active_runs, restore_cluster
from helpers.held_launch import follow_runbook
from longrun.dagrun_ids import incident_run_id
from longrun.drill import DRILL_CONF, Rest, return_to_service, run_drill
from longrun.health import ratelimit
from longrun.slurm.factory import make_client

from training.records import schema
from training.records.orchestrator import Incident
from training.store.factory import store_from_env

from . import grid
from .artefact import CellArtefact, Moment, commit_id
from .harness import (
    Breaker,
    Where,
    at_kill,
    begun,
    choose_slurmd,
    next_steps_begun,
    next_steps_within,
    run_allocations,
    wait_for_step,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.slurm,
    pytest.mark.s3,
    pytest.mark.airflow,
    pytest.mark.timeout(3600),
]

TARGET = "n2"
DRILL = {"kind": "sick-node", "step": 17, "target": TARGET}
STEP_TIMEOUT_S = 900.0
DATABASE = os.environ.get("LONGRUN_TEST_DB", "sqlite")
# (step, component): every step of grid.STEPS x every component of grid.COMPONENTS (issue 14's 70).
# First the 12 cells proven on both databases (docs/reliability.md), in the order they were proven; then
# the rest, most valuable first: the steps that had no cell at all (attribute, pick), then the steps that
# act on the cluster (relaunch, diagnose, drain, freeze), then the hand-overs and the monitor; within a
# step, the components with the fewest cells first (a task process, then Slurm, then Airflow's daemons).
PROVEN = [
    ("drain", "scheduler"),
    ("monitor", "triggerer"),
    ("relaunch", "task"),
    ("relaunch", "slurmctld"),
    ("promotion", "s3"),
    ("hand_over", "scheduler"),
    ("freeze", "triggerer"),
    ("drain", "task"),
    ("diagnose", "slurmd"),
    ("reenter", "dag-processor"),
    ("promotion", "task"),
    ("drain", "s3"),
]
REST = [
    *(
        ("attribute", c)
        for c in ("task", "slurmctld", "dag-processor", "slurmd", "s3", "scheduler", "triggerer")
    ),
    *(("pick", c) for c in ("task", "slurmctld", "dag-processor", "slurmd", "s3", "scheduler", "triggerer")),
    *(("relaunch", c) for c in ("dag-processor", "slurmd", "s3", "scheduler", "triggerer")),
    *(("diagnose", c) for c in ("task", "slurmctld", "dag-processor", "s3", "scheduler", "triggerer")),
    *(("drain", c) for c in ("slurmctld", "dag-processor", "slurmd", "triggerer")),
    *(("freeze", c) for c in ("task", "slurmctld", "dag-processor", "slurmd", "s3", "scheduler")),
    *(("hand_over", c) for c in ("task", "slurmctld", "dag-processor", "slurmd", "s3", "triggerer")),
    *(("promotion", c) for c in ("slurmctld", "dag-processor", "slurmd", "scheduler", "triggerer")),
    *(("reenter", c) for c in ("task", "slurmctld", "slurmd", "s3", "scheduler", "triggerer")),
    *(("monitor", c) for c in ("task", "slurmctld", "dag-processor", "slurmd", "s3", "scheduler")),
]
CELLS = [*PROVEN, *REST]
# The hot-spare row (tests/chaos/grid.py SPARE_GRID): not among the 70, run with LONGRUN_CHAOS=1 only.
SPARE_CELLS = list(grid.SPARE_GRID)
# cell -> why it cannot pass by construction (pytest.mark.xfail(strict=True)): what the operator sees and
# the runbook that applies. Only cells that were run and seen to fail that way (docs/reliability.md).
EXPECTED_FAIL: dict[tuple[str, str], str] = {}


def _param(step: str, component: str) -> Any:
    why = EXPECTED_FAIL.get((step, component))
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(step, component, id=f"{step}-{component}", marks=marks)


STAMP = time.strftime("%H%M%S")


@pytest.fixture(scope="module")
def clean(rest) -> Any:
    result = run_drill(rest, store_from_env(), {**DRILL_CONF, "run_name": f"chaos{STAMP}-clean"})
    assert result.incident is None and result.final_step == DRILL_CONF["steps"]
    return result


@pytest.mark.parametrize(("step", "component"), [_param(s, c) for s, c in CELLS])
def test_cell(rest, clean, local_stack, airflow_stack, cell_done, step: str, component: str) -> None:
    _cell(rest, clean, local_stack, airflow_stack, cell_done, step, component, spare=False)


@pytest.mark.parametrize(("step", "component"), [_param(s, c) for s, c in SPARE_CELLS])
def test_hot_spare_cell(
    rest, clean, local_stack, airflow_stack, cell_done, step: str, component: str
) -> None:
    """The hot-spare row: the run holds a spare node (spare_nodes=1, 4 nodes for 3 ranks) and recovers
    inside its job (plugins/longrun/incident/hot_spare.py); the component is killed after the directive
    was written and before the supervisor started the attempt. The incident must still end once, with
    the clean run's weights: inside the job (one Slurm job, no relaunch submitted), or by the designed
    fall-back to the full relaunch (the kept job cancelled, two jobs), which the CELL line names."""
    _cell(rest, clean, local_stack, airflow_stack, cell_done, step, component, spare=True)


def _cell(
    rest: Rest,
    clean: Any,
    local_stack: Any,
    airflow_stack: Any,
    cell_done: Any,
    step: str,
    component: str,
    *,
    spare: bool,
) -> None:
    """One cell: the drill in a worker thread, the kill at the step, the end state, the artefact.

    Why one function: the cell's try/except/finally is its contract (clean up on any failure, heal the
    stack and write the artefact whatever happened); the parts are the helpers below."""
    run = f"chaos{STAMP}-{step}-{component}".replace("_", "-")
    store = store_from_env()
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    return_to_service(client)
    eng = airflow_db.engine(airflow_stack.env["AIRFLOW_HOME"])
    where = Where(run=run, store=store, client=client, db=eng)
    lines: list[str] = []
    breaker = Breaker(local_stack, say=lambda line: lines.append(f"{time.strftime('%H:%M:%S')} {line}"))
    outcome: dict[str, Any] = {}
    art = CellArtefact(
        database=DATABASE,
        step=step,
        component=component,
        run=run,
        commit=commit_id(),
        drill=DRILL,
        drill_started=time.time(),
        clean_fingerprint=clean.final_fingerprint,
    )
    drill = {**DRILL_CONF, "run_name": run, "drill": DRILL, **({"spare_nodes": 1} if spare else {})}
    worker = threading.Thread(target=_drill, args=(rest, store, client, drill, outcome, lines), daemon=True)
    passed = False
    try:
        art.drill_started = time.time()
        worker.start()
        _break(where, breaker, local_stack, art, lines)
        worker.join(timeout=2700)
        assert not worker.is_alive(), "the drill did not end"
        art.cell_line = _check_end_state(
            local_stack, client, store, clean, outcome, lines, step, component, spare=spare
        )
        passed = True
        # The only way a cell passes (tests/chaos/verdict.py): without this line it fails.
        cell_done(art.cell_line)
    except BaseException as e:
        art.error = f"{type(e).__name__}: {e}"[:4000]
        # A clean-up error must not replace the cell's own failure or a Ctrl-C (which stops the session).
        for cleanup in (
            lambda: fail_active_runs(rest, say=lines.append),
            lambda: restore_cluster(client, say=lines.append),
        ):
            try:
                cleanup()
            except Exception as e:  # noqa: BLE001 - reported with the cell's lines
                lines.append(f"cleanup failed: {e!r}")
        print("\n".join(lines[-80:]))
        raise
    finally:
        try:
            breaker.heal()
        finally:
            _write_artefact(art, outcome, where, local_stack, passed=passed)
            eng.dispose()
    if art.outcome == "missed":
        # Every check held, but the kill landed after a later step began: the cell proves nothing about
        # its own step. Not a pass (the artefact says "missed"), not a defect of the system either.
        pytest.skip(f"{step} x {component}: the kill missed its step ({art.next_steps}); see the artefact")


def _drill(
    rest: Rest, store: Any, client: Any, conf: dict[str, Any], outcome: dict[str, Any], lines: list[str]
) -> None:
    """The drill, in the cell's worker thread; its result or error lands in `outcome`."""
    run = conf["run_name"]
    try:
        outcome["result"] = run_drill(
            rest,
            store,
            conf,
            say=lines.append,
            timeout_s=2400,
            operator=lambda dag_id, run_id: follow_runbook(
                rest, client, run, dag_id, run_id, outcome, resume_reasons=("Duplicate jobid",)
            ),
        )
    except Exception as e:  # noqa: BLE001 - reported by the cell, with what the operator sees
        outcome["error"] = e


def _break(where: Where, breaker: Breaker, stack: Any, art: CellArtefact, lines: list[str]) -> None:
    """Wait for the cell's step, SIGKILL its component, look whether a later step had begun, start the
    component again; what was killed and when goes into the artefact. A slurmd cell kills a node of the
    run's allocation at that moment (harness.choose_slurmd), not the drill's target if it has another."""
    step, component = art.step, art.component
    waited = wait_for_step(where, step, timeout=STEP_TIMEOUT_S)
    art.step_reached = Moment.at(time.time(), art.drill_started)
    lines.append(f"reached {step} after {waited:.1f} s")
    node = why = None
    if component == "slurmd":
        node, why = choose_slurmd(run_allocations(where, stack.slurm.paths["jobcomp"]), target=TARGET)
        lines.append(f"chaos: slurmd of {node}: {why}")
    before = next_steps_begun(where, step)
    killed = breaker.kill(component, where, node=node, step=step)
    kill = breaker.last_kill
    if killed is None or kill is None:
        pytest.fail(f"nothing to kill: {component} had no running process at {step}")
    art.killed = {"pid": kill.pid, "name": kill.name, "node": node, "node_why": why}
    art.kill_landed = Moment.at(kill.time, art.drill_started)
    # The pause before the restart ("let the rest of the system notice") is also the look at the kill.
    art.next_steps = at_kill(before, next_steps_within(where, step, wait_s=3.0))
    art.next_step_begun = begun(art.next_steps)
    breaker.restart(component, node=node)


def _check_end_state(
    stack: Any,
    client: Any,
    store: Any,
    clean: Any,
    outcome: dict[str, Any],
    lines: list[str],
    step: str,
    component: str,
    *,
    spare: bool = False,
) -> str:
    """Every end-state check of the cell (the incident ended once, relaunched, one ledger entry, the node
    drained, the run's jobs, the clean run's weights); returns the cell's `CELL` line."""
    err = outcome.get("error")
    assert err is None, f"{step} x {component}: {err}\n" + "\n".join(lines[-40:])
    result = outcome["result"]
    inc = result.incident
    assert inc is not None and str(inc.status) == "relaunched", result.summary()
    node = inc.attribution.node
    assert node == TARGET, result.summary()
    ledger = [e for e in ratelimit.entries(store) if e["incident_id"] == inc.incident_id]
    assert len(ledger) == 1, ledger
    # The node is sick for good (the drill's marker stays until the cell ends): its diagnosis fails, or,
    # against a reference that was not computed in isolation, stays unconfirmed (the hot-spare path, while
    # the job holds every other node). Never a pass, and the drain reason says which, with the run and step.
    diag = inc.diagnosis
    isolated = diag.extra.get("reference_from") == "idle_node" or diag.extra.get("confirmed_on")
    assert diag.verdict == "fail" or (diag.verdict == "unconfirmed" and not isolated), diag.summary
    state = client.node(TARGET)
    reason = f"longrun:diag-{diag.verdict}:{result.run}:{result.detection_step}"
    assert state.drain_flag and state.reason == reason, (state, reason)
    how = (
        _check_spare_recovery(stack, client, inc, result.run)
        if spare
        else _check_relaunch(stack, client, inc, result.run)
    )
    assert result.final_fingerprint == clean.final_fingerprint, "final weights differ from a clean run"
    # What was broken where, also when the cell passes: the step reached and the process killed.
    print("\n".join(line for line in lines if line.startswith("reached ") or "chaos:" in line))
    by_hand = f" after the operator's runbook ({outcome['runbook']})" if "runbook" in outcome else ""
    return f"CELL {step} x {component}: {how}, weights equal{by_hand}; " + result.summary()


def _check_relaunch(stack: Any, client: Any, inc: Incident, run: str) -> str:
    """The full relaunch: at most one job with the relaunch task's tag, two jobs for the run."""
    incident_run = incident_run_id(inc.alert_key or "")
    relaunched = {j.job_id for j in client.find_jobs(f"longrun/sdc_incident/{incident_run}/relaunch/")}
    assert len(relaunched) <= 1, relaunched  # a finished job may be forgotten; two never
    assert _jobs_named(stack, run) == 2, "the run must have had exactly 2 jobs (first + relaunch)"
    return "relaunched once"


def _check_spare_recovery(stack: Any, client: Any, inc: Incident, run: str) -> str:
    """The hot-spare row: recovered inside the kept job (one job, nothing submitted, the suspect out of the
    attempt's nodes), or fell back to the full relaunch the way hot_spare.py designs it (the kept job
    cancelled, then the relaunch's checks)."""
    events = [e.event for e in inc.timeline]
    if inc.relaunch.in_job:
        assert "relaunch_submitted" not in events, events
        assert TARGET not in (inc.relaunch.nodes or ()), inc.relaunch
        assert _jobs_named(stack, run) == 1, "an in-job recovery must leave the run with its one job"
        return "recovered inside the job"
    fallbacks = (
        "directive_not_followed",
        "earlier_step_running",
        "no_spare_left",
        "kept_job_cancelled",
        "kept_job_ended",
    )
    assert any(e in events for e in fallbacks), events
    _check_relaunch(stack, client, inc, run)
    return "fell back to the full relaunch (" + ", ".join(e for e in fallbacks if e in events) + ")"


def _write_artefact(
    art: CellArtefact, outcome: dict[str, Any], where: Where, stack: Any, *, passed: bool
) -> None:
    """Fill in what the run left (the incident and its verdict, the jobs, the drains, the fingerprint) and
    write the artefact; a part that cannot be read stays empty and is said in `error`, and a failure to
    write is printed: neither may replace the cell's own outcome."""
    result = outcome.get("result")
    inc = result.incident if result is not None else None
    try:
        inc = inc or _incident_from_store(where)
        if inc is not None:
            art.verdict = inc.diagnosis.verdict
            art.incident = {"id": inc.incident_id, "status": str(inc.status), "node": inc.attribution.node}
        art.final_fingerprint = result.final_fingerprint if result is not None else None
        art.jobs = [asdict(a) for a in run_allocations(where, stack.slurm.paths["jobcomp"])]
        art.drains = [e for e in ratelimit.entries(where.store) if e.get("run") == where.run]
    except Exception as e:  # noqa: BLE001 - the artefact says what it could not read
        art.error = f"{art.error + '; ' if art.error else ''}artefact: could not read {type(e).__name__}: {e}"
    try:
        path = art.write(passed=passed)
        print(f"chaos: artefact {path} ({art.outcome})")
    except Exception as e:  # noqa: BLE001
        print(f"chaos: could not write the artefact: {e!r}")


def _incident_from_store(where: Where) -> Incident | None:
    """The run's first incident record, for a cell whose drill produced no result."""
    keys = sorted(
        o.key for o in where.store.list(schema.store_key(where.run, "incidents/")) if o.key.endswith(".json")
    )
    return Incident.from_json(json.loads(where.store.get_bytes(keys[0]))) if keys else None


def _jobs_named(stack, run: str) -> int:  # noqa: ANN001
    """Jobs of the run that Slurm ran (jobcomp's durable record of finished ones) or runs now."""
    path = stack.slurm.paths["jobcomp"]
    done = {
        line.split("JobId=")[1].split()[0]
        for line in (path.read_text().splitlines() if path.exists() else [])
        if f"Name={run} " in line or line.rstrip().endswith(f"Name={run}")
    }
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    active = {str(j.job_id) for j in client.jobs() if j.name == run}
    return len(done | active)
