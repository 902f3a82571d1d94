"""The fault matrix (issue 14): a sick-node drill on the real stack, one component SIGKILLed at one step of
`training_run`'s monitor or of `sdc_incident`, then started again; the incident must still end exactly
once: relaunched once, one drain-ledger entry, the node drained with longrun's reason, one relaunched
job, and final weights bit-identical to a clean run's.

Each cell is (step, component). The step is recognised from the store's records and Slurm's states
(tests/chaos/harness.py), never by patching Airflow. docs/reliability.md has the table these cells fill,
with the command that produced it. Run: `make test-chaos` (LONGRUN_TEST_DB=postgres for PostgreSQL).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
from helpers import airflow_db
from helpers.cleanup import fail_active_runs, restore_cluster
from helpers.held_launch import follow_runbook
from longrun.dagrun_ids import incident_run_id
from longrun.drill import DRILL_CONF, Rest, prepare, return_to_service, run_drill
from longrun.health import ratelimit
from longrun.slurm.factory import make_client

from training.store.factory import store_from_env

from .harness import Breaker, Where, wait_for_step

pytestmark = [
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.slurm,
    pytest.mark.s3,
    pytest.mark.airflow,
    pytest.mark.timeout(3600),
]

DRILL = {"kind": "sick-node", "step": 17, "target": "n2"}
STEP_TIMEOUT_S = 900.0
# (step, component): every step of harness.STEPS x every component of harness.COMPONENTS (issue 14's 70).
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
# cell -> why it cannot pass by construction (pytest.mark.xfail(strict=True)): what the operator sees and
# the runbook that applies. Only cells that were run and seen to fail that way (docs/reliability.md).
EXPECTED_FAIL: dict[tuple[str, str], str] = {}


def _param(step: str, component: str) -> Any:
    why = EXPECTED_FAIL.get((step, component))
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(step, component, id=f"{step}-{component}", marks=marks)


STAMP = time.strftime("%H%M%S")


@pytest.fixture(scope="module")
def env(airflow_stack):
    mp = pytest.MonkeyPatch()
    for k, v in airflow_stack.env.items():
        mp.setenv(k, v)
    yield airflow_stack
    mp.undo()


@pytest.fixture(scope="module")
def rest(env) -> Rest:
    r = Rest.login(env.url, env.user, env.password, timeout=120.0)  # a loaded 2-core host answers slowly
    for attempt in range(3):  # SQLite under load answers "database is locked" as HTTP 500 now and then
        try:
            prepare(r)
            break
        except Exception:
            if attempt == 2:
                raise
            time.sleep(5)
    return r


@pytest.fixture(scope="module")
def clean(rest) -> Any:
    result = run_drill(rest, store_from_env(), {**DRILL_CONF, "run_name": f"chaos{STAMP}-clean"})
    assert result.incident is None and result.final_step == DRILL_CONF["steps"]
    return result


@pytest.mark.parametrize(("step", "component"), [_param(s, c) for s, c in CELLS])
def test_cell(rest, clean, local_stack, airflow_stack, cell_done, step: str, component: str) -> None:
    run = f"chaos{STAMP}-{step}-{component}".replace("_", "-")
    store = store_from_env()
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    return_to_service(client)
    eng = airflow_db.engine(airflow_stack.env["AIRFLOW_HOME"])
    where = Where(run=run, store=store, client=client, db=eng)
    lines: list[str] = []
    breaker = Breaker(local_stack, say=lambda line: lines.append(f"{time.strftime('%H:%M:%S')} {line}"))
    outcome: dict[str, Any] = {}

    def drill() -> None:
        try:
            outcome["result"] = run_drill(
                rest,
                store,
                {**DRILL_CONF, "run_name": run, "drill": DRILL},
                say=lines.append,
                timeout_s=2400,
                operator=lambda dag_id, run_id: follow_runbook(
                    rest, client, run, dag_id, run_id, outcome, resume_reasons=("Duplicate jobid",)
                ),
            )
        except Exception as e:  # noqa: BLE001 - reported below, with what the operator sees
            outcome["error"] = e

    worker = threading.Thread(target=drill, daemon=True)
    worker.start()
    try:
        waited = wait_for_step(where, step, timeout=STEP_TIMEOUT_S)
        lines.append(f"reached {step} after {waited:.1f} s")
        killed = breaker.kill(component, where, step=step)
        if killed is None:
            pytest.fail(f"nothing to kill: {component} had no running process at {step}")
        time.sleep(3.0)  # let the rest of the system notice
        breaker.restart(component)
        worker.join(timeout=2700)
        assert not worker.is_alive(), "the drill did not end"
        err = outcome.get("error")
        assert err is None, f"{step} x {component}: {err}\n" + "\n".join(lines[-40:])
        result = outcome["result"]
        inc = result.incident
        assert inc is not None and str(inc.status) == "relaunched", result.summary()
        node = inc.attribution.node
        assert node == "n2", result.summary()
        ledger = [e for e in ratelimit.entries(store) if e["incident_id"] == inc.incident_id]
        assert len(ledger) == 1, ledger
        state = client.node("n2")
        assert state.drain_flag and (state.reason or "").startswith("longrun:"), state
        incident_run = incident_run_id(inc.alert_key or "")
        relaunched = {j.job_id for j in client.find_jobs(f"longrun/sdc_incident/{incident_run}/relaunch/")}
        assert len(relaunched) <= 1, relaunched  # a finished job may be forgotten; two never
        assert _jobs_named(local_stack, run) == 2, "the run must have had exactly 2 jobs (first + relaunch)"
        assert result.final_fingerprint == clean.final_fingerprint, "final weights differ from a clean run"
        # What was broken where, also when the cell passes: the step reached and the process killed.
        print("\n".join(line for line in lines if line.startswith("reached ") or "chaos:" in line))
        # The only way a cell passes (tests/chaos/verdict.py): without this line it fails.
        by_hand = f" after the operator's runbook ({outcome['runbook']})" if "runbook" in outcome else ""
        cell_done(f"CELL {step} x {component}: relaunched once, weights equal{by_hand}; " + result.summary())
    except BaseException:
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
        breaker.heal()
        eng.dispose()


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
