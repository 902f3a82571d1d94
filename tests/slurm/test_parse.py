"""Parsers for every output shape, 22.05 and 23.02+. Samples under data/ were captured from the local
22.05 cluster; the 23.02+ samples are written from the documented shape (no such cluster here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from longrun.slurm import parse
from longrun.slurm.models import JobStatus


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("n1", ("n1",)),
        ("n[1-3]", ("n1", "n2", "n3")),
        ("n[1-2,4],gpu07", ("n1", "n2", "n4", "gpu07")),
        ("g[08-10]", ("g08", "g09", "g10")),
        ("a1,b2", ("a1", "b2")),
        ("(null)", ()),
        ("", ()),
        (None, ()),
    ],
)
def test_expand_hostlist(text, want):
    assert parse.expand_hostlist(text) == want


def test_kv_line_keeps_spaces_and_equals_in_values():
    d = parse.parse_kv_line(
        "JobId=5 JobName=a b TRES=cpu=1,node=1 Reason=longrun:sdc:r:5 [root@2026-11-29T15:00:00]"
    )
    assert d["JobName"] == "a b"
    assert d["TRES"] == "cpu=1,node=1"
    assert parse.strip_reason(d["Reason"]) == "longrun:sdc:r:5"


@pytest.mark.parametrize(
    ("text", "want"),
    [("0:0", (0, None)), ("3:0", (3, None)), ("0:9", (None, 9)), ("0:15", (None, 15)), ("", (None, None))],
)
def test_exit(text, want):
    assert parse.parse_exit(text) == want


@pytest.mark.parametrize(
    ("text", "base", "flags"),
    [
        ("IDLE", "idle", set()),
        ("IDLE+DRAIN", "idle", {"DRAIN"}),
        ("MIXED+DRAIN", "mixed", {"DRAIN"}),
        ("DOWN*+DRAIN", "down", {"DRAIN", "NOT_RESPONDING"}),
        ("IDLE+MAINTENANCE+RESERVED", "idle", {"MAINTENANCE", "RESERVED"}),
        ("IDLE*", "idle", {"NOT_RESPONDING"}),
    ],
)
def test_node_state(text, base, flags):
    assert parse.split_node_state(text) == (base, frozenset(flags))


SCONTROL_JOB = (
    "JobId=42 JobName=fail3 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0"
    " Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1"
    " Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 RunTime=00:00:00 TimeLimit=00:01:00 TimeMin=N/A"
    " Partition=debug AllocNode:Sid=host:1 ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-2]"
    " BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2"
    " Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=* Command=(null) WorkDir=/tmp"
    " Comment=longrun/d/r/t/-1/1 StdErr=/tmp/slurm-42.out StdIn=/dev/null StdOut=/tmp/slurm-42.out Power="
)


def test_scontrol_job():
    (j,) = parse.jobs_from_scontrol(SCONTROL_JOB + "\n")
    assert (j.job_id, j.status, j.exit_code, j.nodes, j.reason) == (
        42,
        JobStatus.FAILED,
        3,
        ("n1", "n2"),
        "NonZeroExitCode",
    )
    assert j.comment == "longrun/d/r/t/-1/1"
    assert j.is_terminal and not j.is_active


def test_scontrol_pending_held_requeued():
    line = "JobId=9 JobName=x JobState=PENDING Reason=job_requeued_in_held_state Restarts=1 ExitCode=0:0 NodeList=(null)"
    (j,) = parse.jobs_from_scontrol(line)
    assert j.held and j.status is JobStatus.REQUEUED and j.restart_count == 1 and j.nodes == ()


def test_jobcomp_takes_the_last_record_and_skips_torn_lines():
    lines = [
        "JobId=5 UserId=root(0) GroupId=root(0) Name=x JobState=NODE_FAIL Partition=debug TimeLimit=1"
        " NodeList=n3 NodeCnt=1 ProcCnt=1 WorkDir=/tmp ExitCode=0:0",
        "JobId=5 UserId=root(0) GroupId=root(0) Name=x JobState=COMPLETED Partition=debug TimeLimit=1"
        " NodeList=n1 NodeCnt=1 ProcCnt=1 WorkDir=/tmp ExitCode=0:0",
        "JobId=6 UserId=root(0) Name=y JobState=FAILED NodeList=n2 ExitCode=3:0",
        "JobId=",
    ]
    got = parse.jobs_from_jobcomp(lines)
    assert got[5].status is JobStatus.COMPLETED and got[5].nodes == ("n1",) and got[5].source == "jobcomp"
    assert got[6].exit_code == 3 and got[6].name == "y"


SQUEUE_2205 = {
    "jobs": [
        {
            "job_id": 11,
            "name": "a",
            "job_state": "FAILED",
            "state_reason": "NonZeroExitCode",
            "exit_code": 768,  # 22.05 reports the raw wait status: exit 3 << 8
            "restart_cnt": 0,
            "nodes": "n2",
            "comment": "longrun/d/r/t/-1/1",
        },
        {
            "job_id": 12,
            "name": "b",
            "job_state": "RUNNING",
            "state_reason": "None",
            "exit_code": 0,
            "nodes": "n[1-3]",
        },
    ]
}

SQUEUE_2302 = {
    "jobs": [
        {
            "job_id": 11,
            "name": "a",
            "job_state": ["FAILED"],
            "state_reason": "NonZeroExitCode",
            "exit_code": {
                "status": ["EXITED"],
                "return_code": {"set": True, "infinite": False, "number": 3},
                "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""},
            },
            "restart_cnt": 0,
            "nodes": "n2",
            "comment": "longrun/d/r/t/-1/1",
        },
        {
            "job_id": 12,
            "name": "b",
            "job_state": ["PENDING", "REQUEUE_HOLD"],
            "state_reason": "JobHeldAdmin",
            "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "number": 0}},
            "restart_cnt": 2,
            "nodes": "",
        },
        {
            "job_id": 13,
            "name": "c",
            "job_state": ["CANCELLED"],
            "exit_code": {
                "status": ["SIGNALED"],
                "return_code": {"set": True, "number": 0},
                "signal": {"id": 9},
            },
            "nodes": "n4",
        },
    ]
}


@pytest.mark.parametrize("data", [SQUEUE_2205, SQUEUE_2302], ids=["22.05", "23.02+"])
def test_squeue_json_both_shapes(data):
    jobs = {j.job_id: j for j in parse.jobs_from_squeue_json(data)}
    assert jobs[11].status is JobStatus.FAILED and jobs[11].exit_code == 3 and jobs[11].nodes == ("n2",)
    assert jobs[11].comment == "longrun/d/r/t/-1/1"


def test_squeue_2205_running_has_no_exit_code_and_none_reason():
    jobs = {j.job_id: j for j in parse.jobs_from_squeue_json(SQUEUE_2205)}
    assert jobs[12].exit_code is None and jobs[12].reason is None and jobs[12].nodes == ("n1", "n2", "n3")


def test_squeue_2302_flags_hold_and_signal():
    jobs = {j.job_id: j for j in parse.jobs_from_squeue_json(SQUEUE_2302)}
    assert jobs[12].held and jobs[12].status is JobStatus.REQUEUED and jobs[12].flags == ("REQUEUE_HOLD",)
    assert (jobs[13].exit_code, jobs[13].signal) == (None, 9)


def test_squeue_json_takes_slurms_description_as_scontrol_does():
    """squeue's JSON gives a launch-failed hold as the code JobHeldUser plus a description (as on 22.05
    here); scontrol prints the description, with underscores. Both read the same."""
    held = {
        "job_id": 14,
        "name": "d",
        "job_state": "PENDING",
        "state_reason": "JobHeldUser",
        "state_description": "launch failed requeued held",
        "restart_cnt": 1,
        "nodes": "",
    }
    waiting = {**held, "job_id": 15, "state_reason": "Resources", "state_description": "", "restart_cnt": 0}
    jobs = {j.job_id: j for j in parse.jobs_from_squeue_json({"jobs": [held, waiting]})}
    assert jobs[14].reason == "launch_failed_requeued_held" and jobs[14].held
    assert jobs[14].status is JobStatus.REQUEUED
    assert jobs[15].reason == "Resources" and not jobs[15].held


SINFO_2205 = {
    "nodes": [
        {"name": "n1", "state": "idle", "state_flags": [], "reason": ""},
        {"name": "n2", "state": "idle", "state_flags": ["DRAIN"], "reason": "longrun:sdc:r:5"},
        {"name": "n3", "state": "down", "state_flags": ["NOT_RESPONDING"], "reason": "Not responding"},
    ]
}
SINFO_2302 = {
    "sinfo": [
        {"node": {"state": ["IDLE"]}, "nodes": {"nodes": ["n1"]}, "reason": {"description": ""}},
        {
            "node": {"state": ["IDLE", "DRAIN"]},
            "nodes": {"nodes": ["n2"]},
            "reason": {"description": "longrun:sdc:r:5"},
        },
        {
            "node": {"state": ["DOWN", "NOT_RESPONDING"]},
            "nodes": {"nodes": ["n3"]},
            "reason": {"description": "Not responding"},
        },
    ]
}


@pytest.mark.parametrize("data", [SINFO_2205, SINFO_2302], ids=["22.05", "23.02+"])
def test_sinfo_json_both_shapes(data):
    nodes = {n.name: n for n in parse.nodes_from_sinfo_json(data)}
    assert not nodes["n1"].drain_flag and nodes["n1"].reason is None
    assert nodes["n2"].drain_flag and nodes["n2"].is_ours
    assert nodes["n3"].is_down and "NOT_RESPONDING" in nodes["n3"].flags and not nodes["n3"].is_ours


def test_scontrol_node():
    line = (
        "NodeName=n2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=1 State=IDLE+DRAIN ThreadsPerCore=1"
        " Partitions=debug Reason=longrun:sdc:run1:40 [root@2026-11-29T15:40:00]"
    )
    (n,) = parse.nodes_from_scontrol(line)
    assert (n.name, n.state, n.flags, n.reason) == ("n2", "idle", frozenset({"DRAIN"}), "longrun:sdc:run1:40")


DATA = Path(__file__).parent / "data"


def test_captured_22_05_outputs():
    """Outputs captured from the local 22.05 cluster: job 1 exited 3 on n[1-2], job 2 was running on n1,
    n2 was drained by longrun and n3 by an admin."""
    sq = {
        j.job_id: j for j in parse.jobs_from_squeue_json(json.loads((DATA / "squeue_22.05.json").read_text()))
    }
    sc = {j.job_id: j for j in parse.jobs_from_scontrol((DATA / "scontrol_job_22.05.txt").read_text())}
    jc = parse.jobs_from_jobcomp((DATA / "jobcomp_22.05.txt").read_text().splitlines())
    for source in (sq, sc, jc):
        assert (source[1].status, source[1].exit_code, source[1].nodes) == (JobStatus.FAILED, 3, ("n1", "n2"))
    for source in (sq, sc):
        assert source[1].comment == "longrun/d/r/t/-1/1"
        assert (
            source[2].status is JobStatus.RUNNING
            and source[2].exit_code is None
            and source[2].nodes == ("n1",)
        )
    nodes = {
        n.name: n for n in parse.nodes_from_sinfo_json(json.loads((DATA / "sinfo_22.05.json").read_text()))
    }
    sc_nodes = {n.name: n for n in parse.nodes_from_scontrol((DATA / "scontrol_node_22.05.txt").read_text())}
    for source in (nodes, sc_nodes):
        assert source["n2"].drain_flag and source["n2"].is_ours and source["n2"].reason == "longrun:test:x"
        assert (
            source["n3"].drain_flag
            and not source["n3"].is_ours
            and source["n3"].reason == "admin maintenance"
        )
        assert not source["n4"].drain_flag and source["n4"].reason is None


def test_job_steps_from_squeue_steps():
    """`squeue -h --steps -o "%i %j"`: a name may hold spaces or be empty."""
    text = "1234.batch batch\n1234.extern extern\n1234.0 longrun-attempt-0\n1234.1 a b\n1234.2\n\n"
    steps = parse.job_steps_from_squeue(text)
    assert steps == [
        ("1234.batch", "batch"),
        ("1234.extern", "extern"),
        ("1234.0", "longrun-attempt-0"),
        ("1234.1", "a b"),
        ("1234.2", ""),
    ]
    assert steps[2].step_id == "1234.0" and steps[2].name == "longrun-attempt-0"
    assert parse.job_steps_from_squeue("") == []


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("JobId=7 JobName=x BatchFlag=1 BatchHost=n3 NumNodes=2", "n3"),
        ("JobId=7 JobName=x BatchHost=(null) NumNodes=2", None),
        ("JobId=7 JobName=x BatchHost= NumNodes=2", None),
        ("JobId=7 JobName=x NumNodes=2", None),
        ("", None),
    ],
)
def test_batch_host_from_scontrol(line, want):
    assert parse.batch_host_from_scontrol(line) == want
