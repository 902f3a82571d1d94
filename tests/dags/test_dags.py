"""The DAG files: they import without errors or warnings, have the contract's ids and Params, and the
Params refuse bad input with a message (what the UI form and the REST API show)."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def bag(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("AIRFLOW_HOME", str(tmp_path_factory.mktemp("airflow_home")))
    monkeypatch_module.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    from airflow.dag_processing.dagbag import DagBag

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bag = DagBag(dag_folder=str(DAGS))
    ours = [w for w in caught if "/dags/" in str(w.filename) or "longrun" in str(w.filename)]
    assert not ours, [f"{w.category.__name__}: {w.message} ({w.filename})" for w in ours]
    return bag


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_no_import_errors(bag):
    assert bag.import_errors == {}
    assert {"training_run", "sdc_incident", "checkpoint_audit"} <= set(bag.dag_ids)


def test_training_run_params_are_the_contract(bag):
    dag = bag.dags["training_run"]
    contract = {
        "run_name", "nodes", "gpus_per_node", "partition", "model", "steps", "checkpoint_every",
        "recompute_every", "vote_every", "incident_mode", "drill",
    }  # fmt: skip
    assert contract <= set(dag.params)
    for name in contract:
        schema = dag.params.get_param(name).schema
        assert schema.get("section"), f"{name} has no form section"
    described = {
        n
        for n in contract
        if dag.params.get_param(n).description or dag.params.get_param(n).schema.get("title")
    }
    assert described == contract


def test_training_run_shape(bag):
    dag = bag.dags["training_run"]
    assert {"preflight", "submit", "attach", "monitor", "hand_over", "finish"} <= set(dag.task_ids)
    # No task between the monitor and the hand-over: each of the two skips itself on the other's outcome.
    assert dag.get_task("monitor").downstream_task_ids == {"hand_over", "finish"}
    assert dag.get_task("monitor").outlets  # the checkpoint asset alias


def test_sdc_incident_shape(bag):
    dag = bag.dags["sdc_incident"]
    assert [
        t
        for t in (
            "open_record",
            "freeze",
            "attribute",
            "drain",
            "diagnose",
            "pick_checkpoint",
            "relaunch",
            "reenter_monitoring",
            "summary",
        )
        if t not in dag.task_ids
    ] == []
    assert type(dag.get_task("approve_drain")).__name__ == "ApprovalOperator"
    assert type(dag.get_task("approve_relaunch")).__name__ == "ApprovalOperator"
    # The mode gates read only the opened record, so in act mode neither stands on the alert's path ...
    assert dag.get_task("drain_gate").upstream_task_ids == {"open_record"}
    assert dag.get_task("relaunch_gate").upstream_task_ids == {"open_record"}
    # ... while each approval still waits for what it shows, and each action for its approval.
    assert {"attribute", "drain_gate"} <= dag.get_task("approve_drain").upstream_task_ids
    assert {"pick_checkpoint", "relaunch_gate"} <= dag.get_task("approve_relaunch").upstream_task_ids
    assert {"attribute", "approve_drain"} <= dag.get_task("drain").upstream_task_ids
    assert {"pick_checkpoint", "approve_relaunch"} <= dag.get_task("relaunch").upstream_task_ids
    # Queued together, the alert's critical path starts before the tasks beside it (absolute weights, so
    # a gate's many downstream tasks do not lift it above the freeze).
    weight = {t.task_id: t.priority_weight for t in dag.tasks}  # weight_rule absolute: the total
    critical = ("open_record", "freeze", "attribute", "drain", "pick_checkpoint", "relaunch")
    beside = ("drain_gate", "relaunch_gate", "diagnose", "summary", "reenter_monitoring")
    assert min(weight[t] for t in critical) > max(weight[t] for t in beside), weight
    assert weight["freeze"] > weight["attribute"], weight  # the longer of the two (it gates checkpoints)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"nodes": 0}, "nodes"),
        ({"nodes": "three"}, "nodes"),
        ({"incident_mode": "yolo"}, "incident_mode"),
        ({"model": "huge"}, "model"),
        ({"run_name": "../etc"}, "run_name"),
        ({"run_name": "a b;rm"}, "run_name"),
        ({"checkpoint_every": 0}, "checkpoint_every"),
        ({"drill": {"kind": "meteor", "step": 3, "target": "1"}}, "drill"),
        ({"drill": {"kind": "nan", "step": 0, "target": "1"}}, "drill"),
        ({"drill": {"kind": "nan", "step": 3}}, "drill"),
        ({"entrypoint": "module:a;rm -rf /"}, "entrypoint"),
        ({"entrypoint": "module:$(x)"}, "entrypoint"),
        ({"entrypoint": "script:/site/../etc/passwd"}, "entrypoint"),
        ({"entrypoint": "script:relative.py"}, "entrypoint"),
        ({"entrypoint_args": "--lr 1e-3"}, "entrypoint_args"),
        ({"entrypoint_args": ["a\nb"]}, "entrypoint_args"),
        ({"entrypoint_args": ["nul\x00"]}, "entrypoint_args"),
        ({"entrypoint_args": ["a"] * 257}, "entrypoint_args"),
        ({"job_python": "python3"}, "job_python"),
    ],
)
def test_form_refuses_bad_input(bag, override, match):
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(bag.dags["training_run"].params)
    with pytest.raises(ParamValidationError, match=match):
        params.update(override)
        params.validate()


def test_form_accepts_a_drill(bag):
    params = copy.deepcopy(bag.dags["training_run"].params)
    params.update({"drill": {"kind": "sick-node", "step": 12, "target": "n2"}, "nodes": 3})
    resolved = params.validate()
    assert resolved["drill"]["target"] == "n2"


def test_form_accepts_an_entrypoint_with_literal_arguments(bag):
    params = copy.deepcopy(bag.dags["training_run"].params)
    args = ["--data", "/d/my corpus", "$(id)", "it's"]
    params.update({"entrypoint": "script:/site/entrypoints/loop.py", "entrypoint_args": args})
    resolved = params.validate()
    assert resolved["entrypoint_args"] == args and resolved["job_python"] is None


def test_every_incident_step_survives_a_lost_task_process(bag):
    """A task process lost mid-step (SIGKILL, OOM, a worker restart) is retried, never the end of the
    incident: every step is idempotent through the incident record. The chaos cell attribute x task found
    `attribute` with retries=0, which failed the whole incident before the drain."""
    dag = bag.dags["sdc_incident"]
    without = sorted(t.task_id for t in dag.tasks if t.retries < 1)
    assert without == [], f"sdc_incident tasks without retries: {without}"


def test_every_approval_outlasts_the_deferral_race_twice(bag):
    """Airflow 3.3.2's deferral race can fail an approval try as it parks and the next as it resumes with the
    answer (CI: node_return's approve_return failed both of its two tries, and the node was not returned
    after an Approve). Every approval task keeps at least two retries; each retry asks again."""
    approvals = {
        f"{dag_id}.{t.task_id}": t.retries
        for dag_id in ("sdc_incident", "node_return")
        for t in bag.dags[dag_id].tasks
        if type(t).__name__ == "ApprovalOperator"
    }
    assert len(approvals) == 3, approvals
    assert all(r >= 2 for r in approvals.values()), approvals
