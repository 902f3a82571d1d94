"""Closed conf, the job's environment allow-list and the security_event record, without a cluster."""

from __future__ import annotations

import json

import pytest
from longrun import security_events
from longrun.launch import JOB_EXPORT, job_spec_for_run
from longrun.monitor import lifecycle
from longrun.runspec import Drill, RunSpec
from longrun.security_events import SecurityEvent
from longrun.slurm.errors import InvalidSpecError
from longrun.slurm.render import render_sbatch
from longrun.slurm.spec import JobSpec, JobTag

from training.records import schema
from training.records.schema import SchemaError
from training.store.local import LocalDirStore


@pytest.mark.parametrize("key", ["extra_env", "max_restarts", "seed", "time_limit_min", "typo"])
def test_a_run_param_the_form_does_not_declare_is_refused_by_name(key: str) -> None:
    with pytest.raises(lifecycle.UndeclaredParamError, match=repr(key)):
        lifecycle.spec_from_params({"run_name": "r1", key: 1})


def test_a_relaunch_hands_over_only_declared_params() -> None:
    spec = RunSpec(run_name="r1", gpus_per_node=0, extra_env={"X": "1"}, max_restarts=9)
    conf = lifecycle.conf_of(spec.relaunch(resume_from="runs/r1/checkpoints/step-00000010/", exclude=("n2",)))
    assert set(conf) <= set(lifecycle.RUN_PARAMS) and "extra_env" not in conf
    assert lifecycle.spec_from_params(conf).exclude == ("n2",)


def test_a_relaunch_without_a_clean_checkpoint_starts_over_without_the_drill() -> None:
    drill = Drill(kind="nan", step=5, target="n3")
    spec = RunSpec(run_name="r1", gpus_per_node=0, exclude=("n4",), drill=drill, attempt=2)
    again = spec.relaunch(resume_from=None, exclude=("n2", "n4"))
    assert (again.resume_from, again.drill, again.attempt, again.exclude) == (None, None, 3, ("n4", "n2"))


def test_the_job_environment_is_an_allow_list() -> None:
    spec = RunSpec(run_name="r1", nodes=3, gpus_per_node=0)
    tag = JobTag(dag_id="training_run", run_id="manual__1", task_id="submit")
    job = job_spec_for_run(spec, tag=tag, run_dir_root="/shared/runs", env={"LONGRUN_BUCKET": "b"})
    script = render_sbatch(job)
    [line] = [x for x in script.splitlines() if x.startswith("#SBATCH --export=")]
    assert line == "#SBATCH --export=" + ",".join(JOB_EXPORT)
    assert "ALL" not in line.split("=", 1)[1].split(",")
    assert not [n for n in JOB_EXPORT if n.startswith("AIRFLOW") or "SECRET" in n or "PASSWORD" in n]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("export", ("PATH", "AIRFLOW__CORE__FERNET_KEY")),
        ("env", {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "x"}),
        ("exclude", ("ALL",)),
        ("nodelist", ("n[1-3]",)),
    ],
)
def test_the_job_spec_refuses_airflow_names_and_node_sets(field: str, value: object) -> None:
    base = dict(name="j", partition="debug", command=("true",), comment="longrun/t/r/s/-1/1", gpus_per_node=0)
    with pytest.raises(InvalidSpecError):
        JobSpec(**{**base, field: value})


def test_security_event_round_trip_and_validation() -> None:
    ev = SecurityEvent(run="r1", reason="bad_signature", details={"job_id": 5})
    back = SecurityEvent.from_json(ev.to_json())
    assert back == ev and ev.to_json()["runbook"] == "runbooks/security-event.md"
    with pytest.raises(ValueError, match="reason"):
        SecurityEvent(run="r1", reason="Bad Signature!")
    with pytest.raises(ValueError, match="run"):
        SecurityEvent(run="../x", reason="unsigned")
    with pytest.raises(ValueError, match="'at'"):
        SecurityEvent.from_json(
            {"run": "r1", "reason": "unsigned", "kind": "security_event", "schema_version": 1}
        )


# A security event as the code before the shared record readers wrote it (put_json: sorted keys, indent 1).
OLD_EVENT = (
    b'{\n "at": 1764493964.25,\n "details": {\n  "job_id": "4711",\n'
    b'  "key": "runs/r1/alerts/00000040-loss_spike-1a2b.json",\n  "nodes": [\n   "n2"\n  ]\n },\n'
    b' "kind": "security_event",\n "reason": "bad_signature",\n "run": "r1",\n'
    b' "runbook": "runbooks/security-event.md",\n "schema_version": 1\n}'
)


def test_a_security_event_written_before_still_reads_and_a_bad_one_is_skipped(tmp_path) -> None:
    store = LocalDirStore(tmp_path / "store")
    store.put_bytes(
        schema.store_key("r1", f"{security_events.FOLDER}1764493964.250-1a2b3c4d.json"), OLD_EVENT
    )
    bad = {**json.loads(OLD_EVENT), "reason": "Bad Signature!"}  # events() catches the ValueError
    store.put_bytes(
        schema.store_key("r1", f"{security_events.FOLDER}1764493965.000-5e6f7a8b.json"),
        json.dumps(bad).encode(),
    )
    [ev] = security_events.events(store, "r1")
    assert ev == SecurityEvent(
        run="r1",
        reason="bad_signature",
        details={"job_id": "4711", "key": "runs/r1/alerts/00000040-loss_spike-1a2b.json", "nodes": ["n2"]},
        at=1764493964.25,
    )
    assert json.dumps(ev.to_json(), sort_keys=True, indent=1).encode() == OLD_EVENT


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"schema_version": None}, "'schema_version'"),
        ({"schema_version": 2}, "'schema_version'"),
        ({"kind": None}, "'kind'"),
        ({"kind": "run_claim"}, "'kind'"),
        ({"run": None}, "'run'"),
        ({"run": "../x"}, "'run'"),
        ({"reason": None}, "'reason'"),
        ({"reason": "Bad Signature!"}, "'reason'"),
        ({"details": ["job_id"]}, "'details'"),
        ({"at": None}, "'at'"),
        ({"at": "now"}, "'at'"),
        ({"at": -1.0}, "'at'"),
    ],
)
def test_a_malformed_security_event_is_refused_naming_the_field(change: dict, field: str) -> None:
    obj = {k: v for k, v in {**json.loads(OLD_EVENT), **change}.items() if v is not None}
    with pytest.raises(SchemaError, match=field):  # a ValueError, which events() skips
        SecurityEvent.from_json(obj)
