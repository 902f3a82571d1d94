"""Drills are an operator's act (issue 28, item 5).

A `sick-node` drill leaves a marker in the run's fault-state dir; the replay probe that reads the dir
convicts the node. The dir is the job's to write. Before, every probe of an incident's diagnosis and of
`node_return` read the run's dir (and the probe step inherited the workers' LONGRUN_FAULT_STATE_DIR), and
anyone who may trigger `training_run` could set a drill: a job that wrote `sick-nodes/<node>` got any node
of its allocation drained as sick and marked for replacement. Now:

- who may set a drill is the Airflow Variable `longrun_drill_operators` (the decision table, and the
  refusal of a plain user's drill through the real Airflow at the end);
- a probe gets the run's fault-state dir only while the orchestrator's grant says an operator set a
  sick-node drill on that node, and (diagnosis) the incident's job is that drill's launch;
- the drill's marker is removed, and its grant ended, when its incident closes.

The diagnosis tests run the real replay probe on the real four-node Slurm cluster; the last test runs in
the session's real Airflow.
"""

from __future__ import annotations

import json
import shlex
import sys
import uuid
from pathlib import Path

import pytest
from helpers.airflow_api import AirflowApi
from helpers.signed_job import keyed_job, sign_as_job
from longrun import alert_auth, drill_grant
from longrun.cli import main as longrun_main
from longrun.drill_grant import DrillGrant, DrillOperators, DrillPermit, permit
from longrun.health.ratelimit import DrainPolicy
from longrun.incident import closing, drill_state, record, runner, step_diagnose, step_drain, steps
from longrun.monitor import lifecycle
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.factory import make_client
from longrun.slurm.spec import JobTag
from longrun.stack import airflow_cfg
from longrun.stack.airflow_cfg import USER_LOGIN

from training.faults import sick_marker
from training.records import schema
from training.store.factory import store_from_env
from training.store.local import LocalDirStore
from training.store.sides import SidedStore

OPERATORS = DrillOperators(users=frozenset({"anna"}), roles=frozenset({"op"}))


def sided(tmp_path: Path) -> SidedStore:
    """A local store with the orchestrator's side apart from the job's, as every deployment that acts."""
    return SidedStore(job=LocalDirStore(tmp_path / "job"), orchestrator=LocalDirStore(tmp_path / "orch"))


# --- who may set a drill ---


@pytest.mark.parametrize(
    ("user", "roles", "allowed_as"),
    [
        ("anna", None, "user anna"),  # named, whatever the auth manager can tell about roles
        ("bob", ["Op"], "role op"),  # a listed role, in the case Airflow writes it
        ("bob", ["OP", "viewer"], "role op"),
    ],
)
def test_a_listed_user_or_role_may_set_a_drill(user, roles, allowed_as) -> None:
    got = permit(user=user, roles=roles, operators=OPERATORS)
    assert got.allowed and got.allowed_as == allowed_as and got.user == user, got


@pytest.mark.parametrize(
    ("user", "roles", "operators", "says"),
    [
        ("bob", ["user"], OPERATORS, "bob's roles: ['user']"),
        ("bob", None, OPERATORS, "does not tell a task its users' roles"),
        (None, ["admin"], OPERATORS, "did not record who triggered"),
        ("  ", None, OPERATORS, "did not record who triggered"),
        ("anna", ["admin"], DrillOperators(), "is not set or lists nobody"),
    ],
)
def test_anyone_else_is_refused_naming_the_setting(user, roles, operators, says) -> None:
    got = permit(user=user, roles=roles, operators=operators)
    assert not got.allowed and got.allowed_as is None
    assert "longrun_drill_operators" in got.why and says in got.why, got.why


@pytest.mark.parametrize(
    "raw",
    [["anna"], {"users": "anna"}, {"users": [""]}, {"roles": [1]}, {"admins": ["anna"]}, "not json", 5],
)
def test_a_malformed_setting_is_refused_naming_it(raw) -> None:
    with pytest.raises(ValueError, match="longrun_drill_operators"):
        DrillOperators.from_setting(raw)


def test_the_setting_reads_from_json_and_unset_is_nobody() -> None:
    got = DrillOperators.from_setting('{"users": ["anna"], "roles": ["Op"]}')
    assert got == DrillOperators(users=frozenset({"anna"}), roles=frozenset({"op"}))
    assert DrillOperators.from_setting(None) == DrillOperators.from_setting("") == DrillOperators()


def test_the_stack_lets_its_admin_drill_and_no_one_else() -> None:
    """The local stack configures the Variable (in Airflow's environment) for its admin role only."""
    assert airflow_cfg.DRILL_OPERATORS_ENV == "AIRFLOW_VAR_" + drill_grant.OPERATORS_VARIABLE.upper()
    ops = DrillOperators.from_setting(airflow_cfg.DRILL_OPERATORS)
    admin, user = airflow_cfg.ADMIN_USER, airflow_cfg.USER_LOGIN
    assert permit(user=admin, roles=[airflow_cfg.LOGINS[admin]], operators=ops).allowed
    assert not permit(user=user, roles=[airflow_cfg.LOGINS[user]], operators=ops).allowed


# --- which probe reads the run's fault state ---

RUN = "drill-run"
DAG_RUN = "manual__drill"
DRILL_JOB, RELAUNCH_JOB, OTHER_JOB = 7001, 7002, 7003


def bind_job(store, job_id: int, dag_id: str, run_id: str, run: str = RUN) -> None:
    """The key record the orchestrator binds to a job it submitted (what a real submit writes)."""
    tag = JobTag(dag_id=dag_id, run_id=run_id, task_id="submit" if dag_id == "training_run" else "relaunch")
    alert_auth.issue(store, run=run, tag=tag.render())
    alert_auth.bind(store, run=run, tag=tag.render(), job_id=job_id)


def granted(state_dir: Path, *, kind: str = "sick-node", target: str = "n2", run: str = RUN) -> DrillGrant:
    by = DrillPermit(allowed=True, why="test", user="anna", allowed_as="user anna")
    drill = {"kind": kind, "step": 17, "target": target}
    return drill_grant.grant(run=run, dag_run_id=DAG_RUN, drill=drill, by=by, fault_state_dir=str(state_dir))


@pytest.fixture
def drill_store(tmp_path):
    store = sided(tmp_path)
    bind_job(store, DRILL_JOB, "training_run", DAG_RUN)
    bind_job(store, RELAUNCH_JOB, "sdc_incident", "incident__x")
    bind_job(store, OTHER_JOB, "training_run", "manual__another_run_of_the_name")
    return store


def test_without_a_grant_no_probe_reads_the_runs_state(drill_store, tmp_path) -> None:
    for job in (DRILL_JOB, RELAUNCH_JOB, None):
        assert drill_state.for_diagnosis(drill_store, run=RUN, node="n2", job_id=job) is None
    assert drill_state.for_return(drill_store, run=RUN, node="n2") is None


def test_only_the_drills_own_probe_reads_the_state(drill_store, tmp_path) -> None:
    state = tmp_path / "fault-state"
    drill_grant.write(drill_store, granted(state))
    assert drill_state.for_diagnosis(drill_store, run=RUN, node="n2", job_id=DRILL_JOB) == str(state)
    assert drill_state.for_return(drill_store, run=RUN, node="n2") == str(state)
    # another node; the relaunch's job; a job of another DAG run; a job the orchestrator never bound
    assert drill_state.for_diagnosis(drill_store, run=RUN, node="n3", job_id=DRILL_JOB) is None
    assert drill_state.for_return(drill_store, run=RUN, node="n3") is None
    for job in (RELAUNCH_JOB, OTHER_JOB, 7999, None):
        assert drill_state.for_diagnosis(drill_store, run=RUN, node="n2", job_id=job) is None


def test_a_drill_that_leaves_no_state_and_an_ended_one_give_none(drill_store, tmp_path) -> None:
    drill_grant.write(drill_store, granted(tmp_path / "fs", kind="nan", target="n2"))
    assert drill_state.for_diagnosis(drill_store, run=RUN, node="n2", job_id=DRILL_JOB) is None
    drill_grant.write(drill_store, granted(tmp_path / "fs"))
    drill_grant.end(drill_store, RUN, incident_id="inc")
    assert drill_state.for_diagnosis(drill_store, run=RUN, node="n2", job_id=DRILL_JOB) is None
    assert drill_state.for_return(drill_store, run=RUN, node="n2") is None


def test_a_grant_on_a_one_sided_store_counts_for_nothing(tmp_path) -> None:
    """With one side the job identity could write the grant itself."""
    store = LocalDirStore(tmp_path / "store")
    bind_job(store, DRILL_JOB, "training_run", DAG_RUN)
    drill_grant.write(store, granted(tmp_path / "fs"))
    assert drill_state.for_diagnosis(store, run=RUN, node="n2", job_id=DRILL_JOB) is None
    assert drill_state.for_return(store, run=RUN, node="n2") is None


def test_an_unreadable_grant_is_no_grant(drill_store, tmp_path) -> None:
    key = drill_grant.grant_key(RUN)
    drill_store.put_bytes(key, json.dumps({**granted(tmp_path).to_json(), "step": "17"}).encode())
    assert drill_grant.read(drill_store, RUN) is None
    assert drill_state.for_return(drill_store, run=RUN, node="n2") is None


# --- the drill's state goes when its incident closes ---


def drill_incident(store, job_id: int, step: int = 17) -> str:
    alert = {
        **schema.record(
            "alert",
            run=RUN,
            step=step,
            check="recompute",
            suspect_ranks=[1],
            suspect_nodes=["n2"],
            evidence={},
        ),
        "job_id": job_id,
    }
    key = f"runs/{RUN}/alerts/{step:08d}-recompute-r001-{job_id}.json"
    return str(record.open_incident(store, run=RUN, alert=alert, alert_key=key, mode="act")["incident_id"])


def test_closing_the_drills_incident_removes_its_state(drill_store, tmp_path) -> None:
    state = tmp_path / "runs" / RUN / "fault-state"
    marker = sick_marker(state, "n2")
    marker.parent.mkdir(parents=True)
    marker.write_text("sick from step 17\n")
    drill_grant.write(drill_store, granted(state))
    iid = drill_incident(drill_store, DRILL_JOB)

    rec = closing.close(drill_store, run=RUN, incident_id=iid, by="ops", reason="the drill is over")

    assert not marker.exists(), "the drill's sick-node marker outlived its incident"
    ended = [e for e in rec["timeline"] if e["event"] == "drill_ended"]
    assert len(ended) == 1 and ended[0]["state"] == f"removed {marker}", rec["timeline"]
    assert ended[0]["drill"] == "sick-node:17:n2" and ended[0]["set_by"] == "anna"
    grant = drill_grant.read(drill_store, RUN)
    assert grant is not None and not grant.active and grant.ended_by == iid
    assert record.load(drill_store, run=RUN, incident_id=iid)["timeline"] == rec["timeline"]
    # a marker the job writes again afterwards is no drill's: no probe reads it
    marker.write_text("again\n")
    assert drill_state.for_return(drill_store, run=RUN, node="n2") is None
    assert drill_state.for_diagnosis(drill_store, run=RUN, node="n2", job_id=DRILL_JOB) is None


def test_closing_by_hand_says_the_drill_ended(drill_store, tmp_path, monkeypatch, capsys) -> None:
    """`longrun incidents close` on the drill's incident prints what was removed."""
    for name in ("AWS_ENDPOINT_URL", "LONGRUN_BUCKET", "LONGRUN_ORCH_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LONGRUN_STORE_DIR", str(tmp_path / "job"))  # the sides of `drill_store`
    monkeypatch.setenv("LONGRUN_ORCH_STORE_DIR", str(tmp_path / "orch"))
    marker = sick_marker(tmp_path / "fs", "n2")
    marker.parent.mkdir(parents=True)
    marker.write_text("sick\n")
    drill_grant.write(drill_store, granted(tmp_path / "fs"))
    iid = drill_incident(drill_store, DRILL_JOB)
    assert (
        longrun_main(["incidents", "close", "--run", RUN, "--incident", iid, "--reason", "drill over"]) == 0
    )
    assert f"drill sick-node:17:n2 ended: removed {marker}" in capsys.readouterr().out
    assert not marker.exists()


def test_closing_another_incident_of_the_run_leaves_the_drill_on(drill_store, tmp_path) -> None:
    """The relaunch's own incident is not the drill's: the drill (and its marker) stay until the drill's
    incident closes."""
    state = tmp_path / "fs"
    marker = sick_marker(state, "n2")
    marker.parent.mkdir(parents=True)
    marker.write_text("sick\n")
    drill_grant.write(drill_store, granted(state))
    iid = drill_incident(drill_store, RELAUNCH_JOB, step=30)
    rec = closing.close(drill_store, run=RUN, incident_id=iid, by="ops", reason="done")
    assert marker.exists() and "drill_ended" not in [e["event"] for e in rec["timeline"]]
    grant = drill_grant.read(drill_store, RUN)
    assert grant is not None and grant.active


# --- on the real cluster: a job's marker does not convict its node outside a drill ---


CASES = {"no drill": "mark-plain", "no drill, site state dir": "mark-site", "operator's drill": "mark-drill"}


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_marker_the_job_wrote_convicts_its_node_only_in_an_operators_drill(
    case, tmp_path, monkeypatch, slurm_cluster
) -> None:
    """A job of the run (no drill) writes `sick-nodes/n2` into its fault-state dir and signs an alert
    naming n2; the incident drains n2 and diagnoses it with the state dir the tasks hand the probe
    (`drill_state.for_diagnosis`). Outside a drill the real probe passes n2, also when the site sets
    LONGRUN_FAULT_STATE_DIR for its workers (the probe step no longer inherits it); in an operator's
    sick-node drill the same marker convicts n2."""
    monkeypatch.setenv("LONGRUN_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.delenv("LONGRUN_FAULT_STATE_DIR", raising=False)
    if case == "no drill, site state dir":
        monkeypatch.setenv("LONGRUN_FAULT_STATE_DIR", str(tmp_path / "site-fault-state"))
    run = CASES[case]
    spec = lifecycle.spec_from_params({"run_name": run, "nodes": 3, "gpus_per_node": 0})
    state = Path(lifecycle.fault_state_dir(spec))
    marker = sick_marker(state, "n2")
    store = sided(tmp_path)
    # built after the env is set: its srun steps see what the workers' environment would hold
    slurm = make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])
    job_id, key = keyed_job(
        slurm,
        store,
        run=run,
        nodelist=("n1", "n2", "n3"),
        workdir=tmp_path,
        partition="debug",
        command=(f"mkdir -p {shlex.quote(str(marker.parent))}", f"echo forged > {shlex.quote(str(marker))}"),
    )
    assert marker.exists(), "the job did not write its marker"
    if case == "operator's drill":
        by = DrillPermit(allowed=True, why="test", user="anna", allowed_as="user anna")
        drill = {"kind": "sick-node", "step": 17, "target": "n2"}
        rec = drill_grant.grant(
            run=run, dag_run_id=f"test__{run}", drill=drill, by=by, fault_state_dir=str(state)
        )
        drill_grant.write(store, rec)
    alert = schema.record(
        "alert",
        run=run,
        step=17,
        check="recompute",
        suspect_ranks=[1],
        suspect_nodes=["n2"],
        evidence={"world": {"nodes": ["n1", "n2", "n3"]}},
    )
    inc = runner.Incident(
        run=run,
        alert_key=f"runs/{run}/alerts/00000017-recompute-r000-1.json",
        alert=sign_as_job(alert, job_id=job_id, key=key),
        job_id=job_id,
        run_params={"run_name": run, "nodes": 3, "gpus_per_node": 0, "incident_mode": "act"},
        dag_run_id="test",
    )
    steps.open_record(store, inc)
    step_drain.drain(store, slurm, inc, node="n2", policy=DrainPolicy(max_drains=5))
    out = step_diagnose.run_diagnosis(
        store,
        slurm,
        inc,
        node="n2",
        run_nodes=("n1", "n3"),
        state_dir=drill_state.for_diagnosis(store, run=run, node="n2", job_id=job_id),
        python=sys.executable,
    )
    expected = "fail" if case == "operator's drill" else "pass"
    assert out["verdict"] == expected, out["summary"]
    assert slurm.node("n2").reason == f"longrun:diag-{expected}:{run}:17"


# --- through a real Airflow: who set the drill is Airflow's record, not the conf ---


@pytest.mark.airflow
@pytest.mark.slurm
@pytest.mark.s3
@pytest.mark.slow
def test_a_drill_set_by_a_user_who_is_no_operator_is_refused_before_slurm(
    airflow_stack, local_stack, slurm_cluster, monkeypatch
) -> None:
    """The stack's `researcher` login (Airflow role `user`: it may trigger DAGs, and is no operator) names a
    sick-node drill on n2. Preflight refuses it naming the Variable `longrun_drill_operators` (the stack
    lets its admin role drill) and the roles Airflow's auth manager gave the user; no job reaches Slurm
    and no grant is recorded. Before, the run went ahead, and the marker its job left made the incident's
    diagnosis (and node_return) convict n2."""
    for k, val in airflow_stack.env.items():
        monkeypatch.setenv(k, val)
    admin = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
    admin.dag_ready("training_run")
    user = AirflowApi.login(airflow_stack.url, USER_LOGIN, local_stack.airflow.password(USER_LOGIN))
    client = CliSlurmClient(slurm_conf=slurm_cluster.env["SLURM_CONF"])
    run = f"drill-{uuid.uuid4().hex[:6]}"
    drill = {"kind": "sick-node", "step": 1, "target": "n2"}
    conf = {
        "run_name": run,
        "nodes": 1,
        "gpus_per_node": 0,
        "steps": 2,
        "checkpoint_every": 1,
        "drill": drill,
    }
    run_id = user.trigger("training_run", conf=conf)
    try:
        assert admin.wait_run("training_run", run_id, timeout=180) == "failed"
        states = admin.task_states("training_run", run_id)
        assert states["preflight"] == "failed" and states.get("submit") != "success", states
        log = admin.task_log("training_run", run_id, "preflight")
        assert f"{USER_LOGIN} may not set a drill" in log and "longrun_drill_operators" in log, log[-3000:]
        assert f"{USER_LOGIN}'s roles: ['user']" in log, log[-3000:]
        assert [j for j in client.jobs() if j.name == run] == [], "a job reached Slurm"
        assert drill_grant.read(store_from_env(), run) is None
    finally:
        for job in client.jobs():
            if job.name == run:
                client.cancel(job.job_id)
