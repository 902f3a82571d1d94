"""`node_return` through a real Airflow scheduler on the real four-node Slurm cluster and SeaweedFS.

The nodes start where an incident leaves them (drained with longrun's `diag-pass` reason) and their
history is seeded in the store, as the sdc_incident hooks write it; the sick node is an operator's
sick-node drill: its grant (what training_run's preflight records for an operator's drill) and its real
marker, which the real replay probe on that node reads (without the grant no probe reads it:
tests/security/test_drill_operators.py). (The full drill before each return,
training job included, is too slow for this tier: tests/e2e covers the incident half.)

    sick n2 (marker, diag-pass)           -> probe rounds fail: run failed, n2 drained diag-fail, replace mark
    transient n3 (one suspicion)          -> observe: nothing changes; act: every round passes, n3 resumed;
                                             approve: resumed after a person approves; resume skipped,
                                             n3 drained and `return_refused` recorded after a Reject
    repeat offender n4 (two suspicions)   -> refused before any probe: run failed, n4 still drained
    foreign drain n1 ("admin: fan")       -> refused: n1 keeps its reason
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import requests
from helpers.airflow_api import AirflowApi, AirflowApiError, trigger_retrying
from longrun import drill_grant
from longrun.health import history as h
from longrun.monitor import lifecycle
from longrun.slurm.factory import make_client

from training.faults import sick_marker
from training.store.factory import store_from_env

pytestmark = [pytest.mark.airflow, pytest.mark.slurm, pytest.mark.slow]

DAG = "node_return"


@pytest.fixture(scope="module")
def api(airflow_stack) -> AirflowApi:
    a = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
    a.wait_dag_parsed(DAG, file_hint="node_return")
    return a


@pytest.fixture
def client(slurm_cluster):
    c = make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])
    yield c
    for name in c.reservations():  # leave the cluster as we found it
        if name.startswith("longrun_"):
            c.delete_reservation(name)
    for n in c.nodes():
        if n.drain_flag and (n.is_ours or n.reason == "admin: fan"):
            c._run(["scontrol", "update", f"NodeName={n.name}", "State=RESUME"])  # type: ignore[attr-defined]


def seed(hist, node: str, run: str, incidents: list[str], verdict: str = "pass") -> None:
    for i, inc in enumerate(incidents):
        t = time.time() - 3600 * (len(incidents) - i)
        for kind in (h.SUSPECTED, h.DRAINED, h.DIAGNOSED):
            h.append(
                hist,
                h.NodeEvent(
                    node=node,
                    kind=kind,
                    time=t + {h.SUSPECTED: 0, h.DRAINED: 1, h.DIAGNOSED: 2}[kind],
                    source=inc,
                    run=run,
                    incident_id=inc,
                    verdict=verdict if kind == h.DIAGNOSED else None,
                    evidence={"check": "weight_vote", "step": 7} if kind == h.SUSPECTED else {},
                ),
            )


class Ran(dict):
    """Task states; its repr carries the tail of each task's log, for assertion messages."""

    logs: str = ""

    def __repr__(self) -> str:
        return f"{dict(self)}\n{self.logs}"


def approve_when_asked(
    api: AirflowApi, run_id: str, timeout_s: float = 900.0, answer: str = "Approve"
) -> None:
    """Answer the run's approval (Airflow human-in-the-loop) whenever a try waits for one, as a person
    would, until the run ends; bounded. Each try once, and only once it is parked: in Airflow 3.3.2 the
    try that receives the answer can fail on resume ("TaskInstance not in live table but archived") and
    its retry asks again; an answer given before the park is stored but never resumes the task."""
    deadline = time.monotonic() + timeout_s
    url = f"{api.url}/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/approve_return/-1/hitlDetails"
    answered: set[int] = set()
    while time.monotonic() < deadline:
        time.sleep(2)
        try:
            state = api.run(DAG, run_id)["state"]
            tis = api.task_instances(DAG, run_id)
        except (requests.RequestException, AirflowApiError) as e:
            print(f"approval poll: {e} (the API server is busy; asking again)")
            continue
        if state in ("success", "failed"):
            if not answered:
                raise AssertionError(f"{run_id} ended before asking: {api.task_states(DAG, run_id)}")
            return
        for ti in tis:
            tries = int(ti.get("try_number") or 0)
            if ti["task_id"] == "approve_return" and ti["state"] in ("awaiting_input", "deferred"):
                if tries not in answered:
                    try:
                        resp = api.session.patch(url, json={"chosen_options": [answer]}, timeout=api.timeout)
                    except requests.RequestException:
                        continue  # asked again on the next poll; a 409 then means it went through
                    if resp.status_code < 400 or resp.status_code == 409:
                        answered.add(tries)
    raise AssertionError(f"{run_id}: not ended within {timeout_s} s: {api.task_states(DAG, run_id)}")


def run_dag(
    api: AirflowApi, node: str, mode: str = "act", *, answer: str = "Approve", repeats: int = 2
) -> tuple[str, Ran]:
    run_id = trigger_retrying(api, DAG, {"node": node, "mode": mode, "repeats": repeats})
    if mode == "approve":
        approve_when_asked(api, run_id, answer=answer)
    state = api.wait_run(DAG, run_id, timeout=600)
    ran = Ran(api.task_states(DAG, run_id))
    for task_id, st in ran.items():
        if st in ("failed", "success"):
            try:  # the logs only explain a failed assertion; a missing one must not fail the test
                log = api.task_log(DAG, run_id, task_id)
            except (requests.RequestException, AirflowApiError) as e:
                log = f"(log not read: {e})"
            at = log.find("error_detail")
            ran.logs += f"--- {task_id}\n" + (log[at : at + 3000] if at >= 0 else log[-1500:])
    return state, ran


def use_stack_env(airflow_stack, monkeypatch):  # noqa: ANN201
    """The store's credentials (boto3 reads them from os.environ); the node history store."""
    for k, v in airflow_stack.env.items():
        monkeypatch.setenv(k, v)
    return store_from_env()


@pytest.mark.timeout(1800)
def test_sick_repeat_offender_and_foreign_nodes_stay_drained(api, airflow_stack, client, monkeypatch):
    hist = use_stack_env(airflow_stack, monkeypatch)
    tag = uuid.uuid4().hex[:6]
    runs = {n: f"nr-{n}-{tag}" for n in ("n2", "n4")}
    for node, run in runs.items():
        client.drain(node, f"longrun:diag-pass:{run}:7")
    seed(hist, "n2", runs["n2"], [f"inc-n2-{tag}"])
    seed(hist, "n4", runs["n4"], [f"inc-n4a-{tag}", f"inc-n4b-{tag}"])
    spec = lifecycle.spec_from_params({"run_name": runs["n2"]})
    marker = sick_marker(Path(lifecycle.fault_state_dir(spec)), "n2")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("sick-node drill: the node stays sick\n")
    by = drill_grant.DrillPermit(allowed=True, why="test", user="admin", allowed_as="role admin")
    drill_grant.write(
        hist,
        drill_grant.grant(
            run=runs["n2"],
            dag_run_id=f"manual__{runs['n2']}",
            drill={"kind": "sick-node", "step": 7, "target": "n2"},
            by=by,
            fault_state_dir=lifecycle.fault_state_dir(spec),
        ),
    )
    try:
        # Sick: the repeated probe convicts it, it stays drained and is marked for replacement.
        state, tasks = run_dag(api, "n2")
        assert state == "failed" and tasks["resume"] == "success", tasks
        n2 = client.node("n2")
        assert n2.drain_flag and n2.reason == f"longrun:diag-fail:{runs['n2']}:7"
        kinds = [e.kind for e in h.events(hist, "n2")]
        assert h.REPLACE in kinds and h.RETURNED not in kinds
        assert [e.verdict for e in h.events(hist, "n2") if e.kind == h.DIAGNOSED][-1] == "fail"

        # Repeat offender (a second incident on a node with a recent one): refused without a probe,
        # still drained, marked for replacement.
        state, tasks = run_dag(api, "n4")
        assert state == "failed" and tasks["probe"] == "success", tasks
        assert client.node("n4").reason == f"longrun:diag-pass:{runs['n4']}:7"
        kinds = [e.kind for e in h.events(hist, "n4")]
        assert h.REPLACE in kinds and h.RETURN_REFUSED in kinds and h.RETURNED not in kinds
        assert not any(
            e.source.startswith("node_return") for e in h.events(hist, "n4") if e.kind == h.DIAGNOSED
        )

        # Someone else's drain is never lifted.
        client._run(["scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=admin: fan"])  # type: ignore[attr-defined]
        state, _ = run_dag(api, "n1")
        assert state == "failed"
        assert client.node("n1").reason == "admin: fan"
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.timeout(1800)
def test_transient_node_returns_in_act_and_approve_not_in_observe(api, airflow_stack, client, monkeypatch):
    hist = use_stack_env(airflow_stack, monkeypatch)
    run = f"nr-n3-{uuid.uuid4().hex[:6]}"
    client.drain("n3", f"longrun:diag-pass:{run}:7")
    seed(hist, "n3", run, [f"inc-{run}"])

    # Observe: nothing probed, nothing changed, what act would do is recorded.
    state, tasks = run_dag(api, "n3", mode="observe")
    assert state == "success", tasks
    assert client.node("n3").reason == f"longrun:diag-pass:{run}:7"
    assert h.events(hist, "n3")[-1].kind == h.WOULD_RETURN

    # Transient (a weight flip's incident passed its diagnosis): every round passes, the node is resumed.
    state, tasks = run_dag(api, "n3")
    assert state == "success", tasks
    n3 = client.node("n3")
    assert not n3.drain_flag, n3
    evs = h.events(hist, "n3")
    assert evs[-1].kind == h.RETURNED and h.state(evs) == "returned"
    assert len([e for e in evs if e.kind == h.DIAGNOSED and e.source.startswith("node_return")]) == 2

    # Approve: drained again by a later incident (still one suspicion in the window: the seeded one is
    # the only `suspected` event), resumed only after a person approves.
    client.drain("n3", f"longrun:diag-pass:{run}-b:8")
    state, tasks = run_dag(api, "n3", mode="approve")
    assert state == "success" and tasks["approve_return"] == "success", tasks
    assert not client.node("n3").drain_flag


@pytest.mark.timeout(1800)
def test_a_rejected_return_keeps_the_node_drained_and_the_history_says_so(
    api, airflow_stack, client, monkeypatch
):
    """approve mode, every round clean, and a person answers Reject in Airflow's human-in-the-loop form:
    `resume` is skipped, the node keeps longrun's diag-pass drain, the history records who rejected it,
    and the DAG run fails (the node asked for was not returned)."""
    hist = use_stack_env(airflow_stack, monkeypatch)
    run = f"nr-rej-{uuid.uuid4().hex[:6]}"
    reason = f"longrun:diag-pass:{run}:7"
    client.drain("n3", reason)
    seed(hist, "n3", run, [f"inc-{run}"])
    state, tasks = run_dag(api, "n3", mode="approve", answer="Reject", repeats=1)
    assert state == "failed", tasks
    assert tasks["probe"] == "success" and tasks["approve_return"] == "success", tasks
    assert tasks["resume"] == "skipped" and tasks["summary"] == "failed", tasks
    n3 = client.node("n3")
    assert n3.drain_flag and n3.reason == reason, n3
    evs = [e for e in h.events(hist, "n3") if e.source.startswith("node_return")]
    kinds = [e.kind for e in evs]
    assert h.RETURNED not in kinds and h.WOULD_RETURN not in kinds, kinds
    assert [e.verdict for e in evs if e.kind == h.DIAGNOSED] == ["pass"], evs
    refused = [e for e in evs if e.kind == h.RETURN_REFUSED]
    assert len(refused) == 1 and "rejected the return" in (refused[0].reason or ""), refused
    assert h.state(h.events(hist, "n3")) == "diag-pass"
