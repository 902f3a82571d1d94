"""The node's story from real incidents: real drills through Airflow on the real Slurm cluster, then
`node_return` through Airflow on the node each incident left drained (no seeded history, no seeded drain).

    (a) sick-node drill on n2        -> diag-fail; node_return n2 fails, n2 stays drained, marked for replacement
    (b) weight-flip drill on node X  -> diag-pass on X; node_return X returns it
    (c) NaN drill on X again         -> a second incident on X within the window: the incident marks it for
                                        replacement; its diagnosis passes, yet node_return refuses it

(b) and (c) name the node, not a rank: the rendezvous decides which rank runs where, and the story needs
the same node twice (a rank target once landed on another node the second time).

One test, because the story is the history that one step leaves for the next (the session's fleet records
are set aside per test). Three drills of the 40-step tiny model plus three node_return runs. Every node,
reservation and job longrun made is restored in `finally`; a failure also ends the DAG runs (conftest).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from helpers.airflow_api import trigger_retrying
from helpers.cleanup import restore_cluster
from longrun.airflow_rest import AirflowApiError
from longrun.drill import DRILL_CONF, DrillResult, Rest, prepare, return_to_service, run_drill
from longrun.monitor import lifecycle
from longrun.nodes import history as h
from longrun.nodes.cli import main as nodes_main
from longrun.nodes.policy import POLICY_VARIABLE
from longrun.slurm.client import make_client

from training.faults import sick_marker
from training.store import store_from_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.slurm,
    pytest.mark.s3,
    pytest.mark.airflow,
    pytest.mark.timeout(5400),
]

STAMP = time.strftime("%H%M%S")
# The policy this story relies on, set for its duration (another test may have left a different one).
POLICY = {"window_s": 86400.0, "max_suspicions": 2, "probe_repeats": 2, "auto_return": False}
RETURN_TIMEOUT_S = 900.0


def name(step: str) -> str:
    return f"story{STAMP}-{step}"


@pytest.fixture
def env(airflow_stack, monkeypatch):
    for k, v in airflow_stack.env.items():
        monkeypatch.setenv(k, v)
    return airflow_stack


@pytest.fixture
def rest(env):
    r = Rest.login(env.url, env.user, env.password)
    prepare(r)
    r.dag_ready("node_return")
    return r


@pytest.fixture
def node_policy(rest):
    """The story's node policy as the Airflow Variable; the previous value (or none) afterwards."""
    resp = rest.session.get(f"{rest.url}/api/v2/variables/{POLICY_VARIABLE}", timeout=rest.timeout)
    before = resp.json().get("value") if resp.status_code == 200 else None
    rest.set_variable(POLICY_VARIABLE, json.dumps(POLICY))
    yield POLICY
    if before is not None:
        rest.set_variable(POLICY_VARIABLE, before)
    else:
        try:
            rest.request("DELETE", f"/variables/{POLICY_VARIABLE}")
        except AirflowApiError as e:
            print(f"could not delete Variable {POLICY_VARIABLE}: {e}")


def node_return(rest: Rest, node: str) -> tuple[str, dict[str, str | None], str]:
    """Trigger node_return for `node` (act mode) and wait (bounded); (state, task states, select and summary
    logs)."""
    run_id = trigger_retrying(rest, "node_return", {"node": node, "mode": "act"})
    print(f"triggered node_return {run_id} for {node}")
    state = rest.wait_run("node_return", run_id, timeout=RETURN_TIMEOUT_S, interval=2.0)
    tasks = rest.task_states("node_return", run_id)
    log = "\n".join(
        rest.task_log("node_return", run_id, t)
        for t in ("select", "summary")
        if tasks.get(t) in ("success", "failed")
    )
    print(f"node_return {run_id}: {state} {tasks}")
    return state, tasks, log


def drilled(rest: Rest, step: str, drill: dict[str, str | int]) -> DrillResult:
    result = run_drill(rest, store_from_env(), {**DRILL_CONF, "run_name": name(step), "drill": drill})
    print("\n" + result.summary())
    inc = result.incident
    assert inc is not None and inc.status == "relaunched", result.summary()
    assert result.final_step == DRILL_CONF["steps"], result.summary()
    return result


def node_events(node: str, source_prefix: str | None = None) -> list[h.NodeEvent]:
    evs = h.events(h.history_store(), node)
    return [e for e in evs if source_prefix is None or e.source.startswith(source_prefix)]


def test_the_node_story_from_real_incidents(rest, env, node_policy, capsys):
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    return_to_service(client)  # a previous test's node, as the runbook's return-to-service would
    marker = sick_marker(
        Path(lifecycle.fault_state_dir(lifecycle.spec_from_params({"run_name": name("sick")}))), "n2"
    )
    try:
        # (a) A sick node: the incident's diagnosis fails, and node_return will not give it back.
        a = drilled(rest, "sick", {"kind": "sick-node", "step": 17, "target": "n2"})
        assert a.incident is not None and a.incident.attribution.node == "n2"
        fail_reason = f"longrun:diag-fail:{name('sick')}:{a.detection_step}"
        assert client.node("n2").reason == fail_reason
        assert marker.exists(), "the drill's sick-node marker is gone: n2 would not be sick any more"
        state, tasks, log = node_return(rest, "n2")
        assert state == "failed" and tasks["summary"] == "failed", (tasks, log)
        assert tasks["resume"] == "success", tasks  # ran, and returned nothing
        n2 = client.node("n2")
        assert n2.drain_flag and n2.reason == fail_reason, n2
        from_incident = [e.kind for e in node_events("n2", a.incident.incident_id)]
        assert from_incident[:3] == [h.SUSPECTED, h.DRAINED, h.DIAGNOSED], from_incident
        assert [e.verdict for e in node_events("n2") if e.kind == h.DIAGNOSED] == ["fail"]
        by_return = node_events("n2", "node_return")
        assert {e.kind for e in by_return} == {h.RETURN_REFUSED, h.REPLACE}, by_return
        assert all("diagnostic failed" in (e.reason or "") for e in by_return), by_return
        assert "last diagnostic failed" in log, log[-2000:]
        assert h.state(node_events("n2")) == "replace"
        # The vendor swapped the part: a person returns n2 (this is not longrun's decision).
        marker.unlink()
        client.resume("n2")

        # (b) A transient fault: the diagnosis passes and node_return returns the node.
        x = "n3"  # not n2, the node (a) convicted
        b = drilled(rest, "flip", {"kind": "weight-flip", "step": 13, "target": x})
        assert b.incident is not None
        assert b.incident.attribution.node == x, b.incident.attribution
        assert b.incident.diagnosis.verdict == "pass", b.incident.diagnosis.summary
        assert client.node(x).reason == f"longrun:diag-pass:{name('flip')}:{b.detection_step}"
        state, tasks, log = node_return(rest, x)
        assert state == "success", (tasks, log)
        assert not client.node(x).drain_flag, client.node(x)
        rounds = [e for e in node_events(x, "node_return") if e.kind == h.DIAGNOSED]
        assert [e.verdict for e in rounds] == ["pass"] * POLICY["probe_repeats"], rounds
        assert node_events(x)[-1].kind == h.RETURNED and h.state(node_events(x)) == "returned"
        with capsys.disabled():  # the drills' summaries so far, to the terminal (-s) as without capsys
            sys.stdout.write(capsys.readouterr().out)
        assert nodes_main(["show", x]) == 0
        shown = capsys.readouterr().out
        print(shown)
        assert h.RETURNED in shown and b.incident.incident_id in shown, shown

        # (c) A second incident on X within the window: marked for replacement, not returned.
        c = drilled(rest, "again", {"kind": "nan", "step": 13, "target": x})
        assert c.incident is not None
        assert c.incident.attribution.node == x, c.incident.attribution
        noted = c.incident.extra.get("node_history") or {}
        assert noted.get("repeat_offender") is True and noted.get("suspicions_in_window") == 2, noted
        again = node_events(x, c.incident.incident_id)
        assert h.REPLACE in [e.kind for e in again], again
        assert c.incident.diagnosis.verdict == "pass", "the refusal below must not rest on a failed diagnosis"
        pass_reason = f"longrun:diag-pass:{name('again')}:{c.detection_step}"
        assert client.node(x).reason == pass_reason
        returns_before = len([e for e in node_events(x) if e.kind == h.RETURNED])
        state, tasks, log = node_return(rest, x)
        assert state == "failed" and tasks["summary"] == "failed", (tasks, log)
        assert client.node(x).drain_flag and client.node(x).reason == pass_reason
        assert "repeat offender" in log, log[-2000:]
        assert len([e for e in node_events(x) if e.kind == h.RETURNED]) == returns_before
        latest = node_events(x)[-1]
        assert latest.kind in (h.RETURN_REFUSED, h.REPLACE) and h.state(node_events(x)) == "replace"
        # no probe ran for the refused node
        assert not [
            e
            for e in node_events(x, "node_return")
            if e.kind == h.DIAGNOSED and e.time > c.incident.alert["time"]
        ]
    finally:
        marker.unlink(missing_ok=True)
        restore_cluster(client)
