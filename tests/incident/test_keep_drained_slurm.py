"""A suspect node never returns by accident (issue 10, item 5), on the real four-node Slurm cluster.

The diagnose task's death is simulated by running what it does up to the resume inside the MAINT
reservation (drain, reservation with the incident's name, resume) and stopping there, as a killed worker
would. Before this change the node then took jobs once the reservation ended, and the retry refused the
node as "not drained by longrun"; a foreign drain also used a rate-limit slot and failed the task without
a runbook.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from longrun.health import diagnose
from longrun.health.ratelimit import DrainPolicy, entries, reserve_drain
from longrun.incident import keep_drained, record, runbooks, runner, step_diagnose, step_drain, steps
from longrun.slurm import ops
from longrun.slurm.factory import make_client
from longrun.slurm.models import JobStatus

from training.records import schema
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

FOREIGN = "admin: fan"


@pytest.fixture
def client(slurm_cluster):
    c = make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])
    yield c
    # Leave the cluster as we found it: our jobs, reservations and drains, and the foreign drain we set.
    for j in c.jobs():
        if j.is_active and j.name == keep_drained.DIAG_JOB_NAME:
            c.cancel(j.job_id)
    for name in c.reservations():
        if name.startswith("longrun_"):
            for _ in range(60):
                try:
                    c.delete_reservation(name)
                    break
                except Exception:  # noqa: BLE001 - a cancelled job still completing in it
                    time.sleep(0.5)
    for n in c.nodes():
        if n.drain_flag and (n.is_ours or n.reason == FOREIGN):
            c._run(["scontrol", "update", f"NodeName={n.name}", "State=RESUME"])  # type: ignore[attr-defined]


def _incident(node: str, run: str, step: int = 17) -> runner.Incident:
    alert = schema.record(
        "alert",
        run=run,
        step=step,
        check="recompute",
        suspect_ranks=[1],
        suspect_nodes=[node],
        evidence={"world": {"nodes": ["n1", node, "n3"]}},
    )
    return runner.Incident(
        run=run,
        alert_key=f"runs/{run}/alerts/{step:08d}-recompute-r000-1.json",
        alert=alert,
        job_id=None,
        run_params={"run_name": run, "nodes": 3, "gpus_per_node": 0, "incident_mode": "act"},
        dag_run_id="test",
    )


def _drain(store, client, inc: runner.Incident, node: str) -> None:
    """What the drain step does once the alert is authenticated (its gate needs a signed alert from a real
    job, which tests/security covers): a ledger slot, longrun's drain, the record's `drained` event."""
    steps.open_record(store, inc)
    grant = reserve_drain(
        store, incident_id=inc.incident_id, node=node, run=inc.run, policy=DrainPolicy(max_drains=50)
    )
    out = diagnose.drain_suspect(client, node=node, reason=diagnose.sdc_reason(inc.run, inc.step))
    drain = {"node": node, "reason": out.reason, "drained_now": out.drained_now, "in_window": grant.in_window}
    inc.event(store, "drained", fields={"drain": drain}, node=node, reason=out.reason)


def _die_inside_the_reservation(store, client, inc: runner.Incident, node: str) -> str:
    """What the diagnose task does before its diagnostic job, then nothing: the worker died."""
    _drain(store, client, inc, node)
    name = keep_drained.reservation_name(keep_drained.DIAG, inc.incident_id, node)
    client.create_maint_reservation(name, (node,), duration_min=5)
    client.resume(node)
    state = client.node(node)
    assert not state.drain_flag, state  # the hazard: the suspect node is in service once the reservation ends
    assert name in client.reservations()
    return name


def _events(store, inc: runner.Incident) -> list[str]:
    return [e["event"] for e in record.load(store, run=inc.run, incident_id=inc.incident_id)["timeline"]]


def test_reservation_names_are_deterministic_per_incident_and_node() -> None:
    a = keep_drained.reservation_name(keep_drained.DIAG, "inc-1", "n2")
    assert a == keep_drained.reservation_name(keep_drained.DIAG, "inc-1", "n2")
    assert a != keep_drained.reservation_name(keep_drained.DIAG, "inc-2", "n2")
    assert a != keep_drained.reservation_name(keep_drained.REF, "inc-1", "n2")
    assert a.startswith(keep_drained.reservation_prefix(keep_drained.DIAG, "inc-1")) and a.endswith("_n2")


def test_diagnose_retry_redrains_removes_the_leftover_and_diagnoses(tmp_path, client) -> None:
    store = LocalDirStore(tmp_path / "store")
    inc = _incident("n2", "kd1")
    leftover = _die_inside_the_reservation(store, client, inc, "n2")

    out = step_diagnose.run_diagnosis(
        store,
        client,
        inc,
        node="n2",
        run_nodes=("n1", "n3"),
        state_dir=str(tmp_path / "fs"),
        python=sys.executable,
    )  # the retry
    assert out["verdict"] == "pass", out["summary"]
    assert client.node("n2").drain_flag and client.node("n2").reason == "longrun:diag-pass:kd1:17"
    assert not [r for r in client.reservations() if r.startswith("longrun_")]
    rec = record.load(store, run=inc.run, incident_id=inc.incident_id)
    restored = [e for e in rec["timeline"] if e["event"] == "restored"]
    assert (
        restored and restored[0]["removed_reservations"] == [leftover] and restored[0]["redrained"] == ["n2"]
    )
    assert len(entries(store)) == 1  # the retry took no second ledger slot


def test_next_step_redrains_and_cancels_a_diagnostic_that_outlived_its_task(
    tmp_path, client, slurm_cluster
) -> None:
    """srun runs in a session of its own, so the diagnostic job may outlive the killed task; the next step
    (the summary calls `restore_drain`) cancels it, deletes the reservation and drains the node again."""
    store = LocalDirStore(tmp_path / "store")
    inc = _incident("n3", "kd2", step=5)
    leftover = _die_inside_the_reservation(store, client, inc, "n3")
    env = {**os.environ, **slurm_cluster.env}
    orphan = subprocess.Popen(
        [
            "srun",
            f"--reservation={leftover}",
            "--nodelist=n3",
            "-N1",
            "-n1",
            "--job-name=longrun-diag",
            "sleep",
            "300",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(
            j.name == "longrun-diag" and j.status is JobStatus.RUNNING and j.nodes == ("n3",)
            for j in client.jobs()
        ):
            assert time.monotonic() < deadline, "the orphan diagnostic never started"
            time.sleep(0.3)

        out = step_drain.restore_drain(store, client, inc)
        assert out == {"removed_reservations": [leftover], "redrained": ["n3"], "nodes": ["n3"]}
        assert client.node("n3").reason == "longrun:sdc:kd2:5"
        assert leftover not in client.reservations()
        orphan.wait(timeout=60)  # srun ends with its cancelled job
        # A second call finds nothing to do and writes nothing.
        assert step_drain.restore_drain(store, client, inc) == {
            "removed_reservations": [],
            "redrained": [],
            "nodes": ["n3"],
        }
        assert _events(store, inc).count("restored") == 1
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait(timeout=10)


def test_a_node_taken_over_by_someone_else_is_left_alone(tmp_path, client) -> None:
    store = LocalDirStore(tmp_path / "store")
    inc = _incident("n2", "kd4")
    _drain(store, client, inc, "n2")
    client._run(["scontrol", "update", "NodeName=n2", "State=DRAIN", f"Reason={FOREIGN}"])  # type: ignore[attr-defined]
    with pytest.raises(runner.IncidentStop, match="someone else"):
        step_drain.restore_drain(store, client, inc)
    assert client.node("n2").reason == FOREIGN
    assert "foreign_drain" in _events(store, inc)
    rec = record.load(store, run=inc.run, incident_id=inc.incident_id)
    assert rec["status"] == record.FAILED and runbooks.FOREIGN_DRAIN in rec["runbooks"]


def test_a_grant_without_its_drained_event_is_drained_by_the_next_step(tmp_path, client) -> None:
    """The drain task died between the ledger's grant and the `drained` event, and its retries never got
    further (or the node was resumed after its drain): the ledger still says longrun drains it."""
    store = LocalDirStore(tmp_path / "store")
    inc = _incident("n4", "kd5", step=3)
    steps.open_record(store, inc)
    reserve_drain(store, incident_id=inc.incident_id, node="n4", run=inc.run)
    assert not client.node("n4").drain_flag
    out = step_drain.restore_drain(store, client, inc)
    assert out["redrained"] == ["n4"] and client.node("n4").reason == "longrun:sdc:kd5:3"


def test_the_summary_restores_again_what_a_restarted_controller_forgot(tmp_path, client) -> None:
    """slurmctld saves changed state at most every 5 s: killed sooner, it restarts without a drain and a
    reservation deletion that `scontrol` had acknowledged (the fault matrix's promotion x slurmctld cell
    on PostgreSQL: the diagnosed node came back idle, still in its diagnostic reservation). The summary's
    restore reads Slurm again after the state-save window. What the restart undoes is simulated inside
    that wait (the node resumed, the reservation back): killing the controller here would stop the
    cluster every other test shares; the chaos cell kills the real one."""
    store = LocalDirStore(tmp_path / "store")
    inc = _incident("n3", "kd5", step=9)
    _drain(store, client, inc, "n3")
    name = keep_drained.reservation_name(keep_drained.DIAG, inc.incident_id, "n3")
    waited: list[float] = []

    def controller_forgets(seconds: float) -> None:
        waited.append(seconds)
        client.create_maint_reservation(name, ("n3",), duration_min=5)
        client.resume("n3")

    out = keep_drained.restore_durably(store, client, inc, sleep=controller_forgets)
    assert waited == [ops.STATE_SAVE_WINDOW_S]
    assert (out.redrained, out.removed_reservations) == (("n3",), (name,))
    state = client.node("n3")
    assert state.drain_flag and state.reason == "longrun:sdc:kd5:9", state
    assert name not in client.reservations()
    assert _events(store, inc).count("restored") == 1
