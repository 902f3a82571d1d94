"""The incident record's parts (training/records/incident.py): each reads the JSON the previous code
wrote (literal objects below, as they sit in records and XCom today), gives the same object back, and
refuses a wrong type with an error naming the field; an incident without a part still reads."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from training.records import schema
from training.records.diagnosis import Diagnosis, NodeCheck, ProbeResult
from training.records.incident import Attribution, Closing, Drain, Recovery, Relaunch, RestartCheckpoint
from training.records.orchestrator import Incident

T = 1764430000.5

# The reservation path's diagnosis (step_diagnose): Diagnosis.to_dict() of incident/diagnose.py with
# node_check's JSON as `details`, plus the reference node, the DCGM level and the total time.
DIAGNOSIS_JSON = """{
 "dcgm_level": 2,
 "details": {
  "dcgm": null,
  "node": "n2",
  "probe": {
   "exit_code": 1,
   "result": {
    "cpu_capability": "AVX2",
    "duration_s": 0.412,
    "expect": "0123456789abcdef",
    "fingerprint": "fedcba9876543210",
    "node": "n2",
    "threads": 1,
    "torch": "2.6.0+cpu",
    "verdict": "fail"
   },
   "stderr_tail": "",
   "verdict": "fail"
  },
  "verdict": "fail"
 },
 "duration_s": 3.25,
 "exit_code": 1,
 "node": "n2",
 "reason": "longrun:diag-fail:r1:17",
 "reference_node": "n1",
 "runbook": "runbooks/diagnostic-failed.md",
 "summary": "n2: fail; probe fail; fingerprint fedcba9876543210 (expected 0123456789abcdef); dcgmi absent",
 "total_s": 7.5,
 "verdict": "fail"
}"""

# The in-job path (hot_spare) adds where it ran and the job; node_check printed nothing here, so its
# details are the error shape with the output's tails; a DCGM result is kept as DCGM wrote it.
IN_JOB = {
    "node": "n3",
    "verdict": "error",
    "reason": "longrun:diag-error:r1:17",
    "summary": "n3: error; probe None; dcgmi absent on the node",
    "runbook": "runbooks/diagnostic-failed.md",
    "duration_s": 1.0,
    "exit_code": 2,
    "details": {"verdict": "error", "stdout_tail": "", "stderr_tail": "srun: error"},
    "reference_node": None,
    "dcgm_level": 3,
    "total_s": 2.5,
    "where": "in_job",
    "job_id": 41,
}


def _incident(**parts: Any) -> dict[str, Any]:
    return schema.record(
        "incident",
        run="r1",
        incident_id="00000017-recompute-r001-1",
        alert={"step": 17, "check": "recompute"},
        timeline=[{"event": "opened", "time": T}],
        mode="act",
        status="relaunched",
        **parts,
    )


def test_diagnosis_reads_what_was_written_and_gives_it_back() -> None:
    written = json.loads(DIAGNOSIS_JSON)
    d = Diagnosis.from_json(written)
    assert d.verdict == "fail" and d.reference_node == "n1" and d.dcgm_level == 2 and d.where is None
    assert d.checked.probe is not None and d.checked.probe.verdict == "fail"
    res = d.checked.probe_result
    assert res.fingerprint == "fedcba9876543210" and res.expected_fingerprint == "0123456789abcdef"
    assert res.env == ("2.6.0+cpu", "AVX2", 1) and d.checked.dcgm is None
    assert d.to_json() == written
    assert json.dumps(d.to_json(), sort_keys=True, indent=1) == DIAGNOSIS_JSON  # null dcgm kept

    in_job = Diagnosis.from_json(IN_JOB)
    assert in_job.where == "in_job" and in_job.job_id == 41 and in_job.reference_node is None
    assert in_job.checked.stderr_tail == "srun: error" and not in_job.checked.probe_result
    assert in_job.to_json() == IN_JOB and "dcgm" not in in_job.to_json()["details"]

    # a field a newer writer adds is kept; older probes said `expected`
    newer = Diagnosis.from_json(
        {**IN_JOB, "attempts": 2, "details": {"probe": {"result": {"expected": "ab"}}}}
    )
    assert newer.extra == {"attempts": 2} and newer.checked.probe_result.expected_fingerprint == "ab"


def test_the_incident_holds_the_diagnosis_typed_and_old_records_still_read() -> None:
    written = _incident(diagnosis=json.loads(DIAGNOSIS_JSON))
    inc = Incident.from_json(copy.deepcopy(written))
    assert isinstance(inc.diagnosis, Diagnosis) and inc.diagnosis.summary.startswith("n2: fail")
    assert inc.to_json() == written

    old = _incident()  # opened, never diagnosed (or written before the diagnosis existed)
    inc = Incident.from_json(old)
    assert not inc.diagnosis and inc.diagnosis.verdict is None and inc.to_json() == old
    partial = _incident(diagnosis={"verdict": "pass"})
    assert Incident.from_json(partial).diagnosis.verdict == "pass"
    assert Incident.from_json(partial).to_json() == partial
    # code that still looks fields up by name reads the same values
    assert Incident.from_json(written).diagnosis.verdict == "fail"


@pytest.mark.parametrize(
    ("diagnosis", "field"),
    [
        ({"verdict": 3}, "verdict"),
        ({"exit_code": "1"}, "exit_code"),
        ({"details": []}, "details"),
        ({"details": {"probe": "fail"}}, "probe"),
        ({"details": {"probe": {"result": {"threads": "1"}}}}, "threads"),
        ({"details": {"dcgm": "passed"}}, "dcgm"),
        ({"job_id": 4.5}, "job_id"),
    ],
)
def test_a_malformed_diagnosis_is_refused_naming_the_field(diagnosis: dict[str, Any], field: str) -> None:
    with pytest.raises(schema.SchemaError, match=f"'{field}'"):
        Diagnosis.from_json(diagnosis)
    with pytest.raises(schema.SchemaError, match=f"'{field}'"):
        Incident.from_json(_incident(diagnosis=diagnosis))


def test_a_reference_and_node_check_read_alone() -> None:
    ref = {"node": "n1", "verdict": "no-reference", "fingerprint": "ab", "expect": None, "threads": 1}
    r = ProbeResult.from_json(ref)
    assert r.node == "n1" and r.expect is None and r.to_json() == ref  # `expect: null` kept
    nc = NodeCheck.from_json({"node": "n2", "verdict": "pass", "probe": None, "dcgm": {"passed": True}})
    assert nc.probe is None and nc.dcgm == {"passed": True} and not nc.probe_result
    with pytest.raises(schema.SchemaError, match="fingerprint"):
        ProbeResult.from_json({"fingerprint": 12})


# The attribute step's result and the record's `attribution` (incident/attribution.py's to_dict()).
ATTRIBUTED = {
    "verdict": "node",
    "node": "n2",
    "ranks": [1],
    "reason": "recompute at step 17: ranks [1] on n2 disagree with the majority",
    "runbook": "runbooks/recompute-mismatch.md",
}
AMBIGUOUS = {
    "verdict": "ambiguous",
    "node": None,
    "ranks": [],
    "reason": "recompute at step 17: the evidence names no node",
    "runbook": "runbooks/ambiguous-evidence.md",
}


def test_attribution_reads_what_was_written_and_gives_it_back() -> None:
    from longrun.incident.attribution import attribute

    alert = schema.record(
        "alert", run="r1", step=17, check="recompute", suspect_ranks=[1], suspect_nodes=["n2"], evidence={}
    )
    assert attribute(alert).to_dict()["node"] == ATTRIBUTED["node"]  # the writer's shape
    att = Attribution.from_json(ATTRIBUTED)
    assert att.node == "n2" and att.ranks == (1,) and not att.ambiguous and att.to_json() == ATTRIBUTED
    amb = Attribution.from_json(AMBIGUOUS)
    assert amb.ambiguous and amb.node is None and amb.to_json() == AMBIGUOUS  # `node: null` kept
    written = _incident(attribution=ATTRIBUTED)
    assert Incident.from_json(written).attribution.node == "n2"
    assert Incident.from_json(written).to_json() == written
    assert not Incident.from_json(_incident()).attribution  # not attributed yet
    for bad, field in (({"node": ["n2"]}, "node"), ({"ranks": ["1"]}, "ranks"), ("n2", "attribution")):
        with pytest.raises(schema.SchemaError, match=f"'{field}'"):
            Incident.from_json(_incident(attribution=bad))


def test_restart_checkpoint_reads_what_was_written_and_gives_it_back() -> None:
    picked = {"step": 10, "key": "runs/r1/checkpoints/00000010", "why": "last validated before step 17"}
    clean = {"step": 0, "key": None, "why": "no checkpoint; restarting from step 0"}
    result = {**picked, "lost_steps": 7}  # the pick step's XCom result
    for written in (picked, clean, result):
        assert RestartCheckpoint.from_json(written).to_json() == written
    assert (
        RestartCheckpoint.from_json(clean).key is None and RestartCheckpoint.from_json(result).lost_steps == 7
    )
    inc = _incident(checkpoint=picked, lost_steps=7)
    assert Incident.from_json(inc).checkpoint.step == 10 and Incident.from_json(inc).to_json() == inc
    assert Incident.from_json(_incident()).checkpoint.step is None
    for bad, field in (({"step": "10"}, "step"), ({"key": 3}, "key"), ({"step": True}, "step")):
        with pytest.raises(schema.SchemaError, match=f"'{field}'"):
            Incident.from_json(_incident(checkpoint=bad))


def test_relaunch_reads_what_was_written_and_gives_it_back() -> None:
    full = {  # step_relaunch's result, as the record keeps it
        "job_id": 42,
        "nodes": ["n1", "n3"],
        "exclude": ["n2"],
        "resume_from": "runs/r1/checkpoints/00000010",
        "attempt": 1,
        "note": "",
        "params": {"run_name": "r1", "attempt": 1},
    }
    clean = {**full, "resume_from": None}  # a clean start resumes from nothing
    in_job = {**full, "job_id": 41, "note": "in-job relaunch on a hot spare (directive d)", "in_job": True}
    for written in (full, clean, in_job):
        assert Relaunch.from_json(written).to_json() == written
    rl = Relaunch.from_json(full)
    assert rl.job_id == 42 and rl.nodes == ("n1", "n3") and rl.exclude == ("n2",) and rl.in_job is None
    assert Relaunch.from_json(in_job).in_job is True
    inc = _incident(relaunch=full, time_to_recover_s=12.5)
    assert Incident.from_json(inc).relaunch.nodes == ("n1", "n3") and Incident.from_json(inc).to_json() == inc
    assert not Incident.from_json(_incident()).relaunch
    for bad, field in (({"nodes": "n1"}, "nodes"), ({"attempt": 1.5}, "attempt"), ({"params": []}, "params")):
        with pytest.raises(schema.SchemaError, match=f"'{field}'"):
            Incident.from_json(_incident(relaunch=bad))


def test_drain_reads_what_was_written_and_gives_it_back() -> None:
    written = {"node": "n2", "reason": "longrun:sdc:r1:17", "drained_now": True, "in_window": 1}
    d = Drain.from_json(written)
    assert d.node == "n2" and d.drained_now is True and d.in_window == 1 and d.to_json() == written
    rerun = {"node": "n2", "reason": "longrun:sdc:r1:17", "drained_now": False, "rerun": True}  # XCom
    assert Drain.from_json(rerun).rerun is True and Drain.from_json(rerun).to_json() == rerun
    inc = _incident(drain=written)
    assert (
        Incident.from_json(inc).drain.reason == "longrun:sdc:r1:17"
        and Incident.from_json(inc).to_json() == inc
    )
    assert not Incident.from_json(_incident()).drain
    for bad, field in (({"drained_now": "yes"}, "drained_now"), ({"in_window": True}, "in_window")):
        with pytest.raises(schema.SchemaError, match=f"'{field}'"):
            Incident.from_json(_incident(drain=bad))


# As the later steps add them, after the other fields: the probe's reference (json.dumps sort_keys, as
# training.probe prints it), recovery.measure's result (nulls where nothing was measured), the closing.
REFERENCE = {"cpu_capability": "AVX2", "duration_s": 2, "expect": None, "fingerprint": "ab12", "node": "n1"}
REFERENCE |= {"threads": 1, "torch": "2.5.1", "verdict": "no-reference"}
RECOVERY_JSON = (
    '{"milestones_s": {"fault_injected": -3.5, "alert_written": 0.0, "drained": 4.25, "first_healthy_step": null}, '
    '"alert_to_first_healthy_step_s": 61.5, "relaunch_segment": "41.0-r0", "pick_step": 10, "start_step": 10, '
    '"first_step": 11, "resumed_as_picked": true, "lost_steps": null}'
)
CLOSED_JSON = '{"time": 1764430100, "by": "longrun", "reason": "healthy for 20 steps", "healthy_steps": 20}'


def test_the_incident_holds_reference_recovery_and_closing_typed() -> None:
    written = _incident(runbooks=["runbooks/recompute-mismatch.md"])
    written |= {
        "reference": REFERENCE,
        "recovery": json.loads(RECOVERY_JSON),
        "closed": json.loads(CLOSED_JSON),
    }
    text = json.dumps(written)
    inc = Incident.from_json(json.loads(text))
    assert inc.extra == {}  # no longer read from the record's other fields
    assert isinstance(inc.reference, ProbeResult) and inc.reference.fingerprint == "ab12"
    assert isinstance(inc.recovery, Recovery) and inc.recovery.alert_to_first_healthy_step_s == 61.5
    assert inc.recovery.resumed_as_picked is True and inc.recovery.lost_steps is None
    assert inc.recovery.milestones_s == json.loads(RECOVERY_JSON)["milestones_s"]
    assert isinstance(inc.closed, Closing) and (inc.closed.by, inc.closed.healthy_steps) == ("longrun", 20)
    assert inc.closed.reason == "healthy for 20 steps" and inc.closed.time == 1764430100
    # the same object back: the record's text as before (its other fields, then these three as written;
    # the reference's keys in the probe result's own order, as `reference_of` has always given them)
    back = inc.to_json()
    assert back == written and list(back)[-3:] == ["reference", "recovery", "closed"]
    assert json.dumps(back["recovery"]) == RECOVERY_JSON and json.dumps(back["closed"]) == CLOSED_JSON
    assert json.dumps({**back, "reference": REFERENCE}) == text


def test_an_incident_without_reference_recovery_or_closing_still_reads() -> None:
    old = _incident()
    inc = Incident.from_json(copy.deepcopy(old))
    assert not inc.reference and not inc.recovery and not inc.closed
    assert inc.recovery.alert_to_first_healthy_step_s is None and inc.closed.reason is None
    assert inc.to_json() == old and json.dumps(inc.to_json()) == json.dumps(old)
    operator = _incident(closed={"time": T, "by": "ann", "reason": "known bad cable", "healthy_steps": None})
    assert Incident.from_json(operator).closed.healthy_steps is None
    assert json.dumps(Incident.from_json(operator).to_json()) == json.dumps(operator)


@pytest.mark.parametrize(
    ("part", "value", "field"),
    [
        ("reference", {"threads": "1"}, "threads"),
        ("recovery", {"pick_step": "10"}, "pick_step"),
        ("recovery", {"resumed_as_picked": 1}, "resumed_as_picked"),
        ("closed", {"reason": 3}, "reason"),
        ("closed", {"time": True}, "time"),
        ("closed", "by ann", "closed"),
    ],
)
def test_a_malformed_reference_recovery_or_closing_is_refused_naming_the_field(
    part: str, value: Any, field: str
) -> None:
    with pytest.raises(schema.SchemaError, match=f"'{field}'"):
        Incident.from_json(_incident(**{part: value}))
