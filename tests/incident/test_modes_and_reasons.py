"""Modes, drain reasons, the node-side verdict, and picking a healthy node (pure parts of diagnose)."""

from __future__ import annotations

import json

import pytest
from longrun.health import diagnose, node_check
from longrun.incident import modes
from longrun.slurm.errors import InvalidSpecError
from longrun.slurm.models import CommandResult, NodeState


def test_modes():
    assert modes.plan("act") == modes.ModePlan(mode="act", changes=True, approval=False)
    assert modes.plan("approve").approval and modes.plan("approve").changes
    assert not modes.plan("observe").changes
    with pytest.raises(ValueError, match="incident_mode='yolo'"):
        modes.plan("yolo")


def test_reasons_carry_the_prefix_and_round_trip():
    assert diagnose.sdc_reason("r1", 17) == "longrun:sdc:r1:17"
    assert diagnose.verdict_reason("r1", 17, "fail") == "longrun:diag-fail:r1:17"
    assert diagnose.parse_reason("longrun:diag-pass:r1:17") == ("diag-pass", "r1", 17)
    assert diagnose.parse_reason("admin: bad fan") is None
    with pytest.raises(ValueError, match="verdict='maybe'"):
        diagnose.verdict_reason("r1", 1, "maybe")
    with pytest.raises(InvalidSpecError):
        diagnose.sdc_reason("r;rm", 1)


def test_node_check_argv_is_validated():
    argv = diagnose.node_check_argv(node="n2", expect="ab12", dcgm_level=3, probe_timeout_s=60, python="py")
    assert argv == ("py", "-m", "longrun.health.node_check", "--node", "n2", "--expect", "ab12",
                    "--dcgm-level", "3", "--probe-timeout", "60")  # fmt: skip
    with pytest.raises(ValueError, match="expect="):
        diagnose.node_check_argv(node="n2", expect="zz;", dcgm_level=3, probe_timeout_s=60)
    with pytest.raises(InvalidSpecError):
        diagnose.node_check_argv(node="--wrap=x", expect=None, dcgm_level=3, probe_timeout_s=60)


@pytest.mark.parametrize(
    ("obj", "rc", "want"),
    [
        ({"verdict": "fail"}, 0, "fail"),
        ({"ok": True}, 1, "pass"),
        ({"match": False}, 0, "fail"),
        ({"fingerprint": "ab"}, 0, "pass"),
        ({"fingerprint": "ab"}, 3, "fail"),
        (None, 0, "error"),
    ],
)
def test_probe_verdict(obj, rc, want):
    assert node_check.probe_verdict(obj, rc) == want


def test_combine():
    assert node_check.combine({"verdict": "pass"}, None) == "pass"
    assert node_check.combine({"verdict": "pass"}, {"passed": False}) == "fail"
    assert node_check.combine({"verdict": "fail"}, {"passed": True}) == "fail"
    assert node_check.combine({"verdict": "error"}, None) == "error"


def test_last_json_line():
    assert node_check.last_json_line('log\n{"a": 1}\nnoise {x}\n') == {"a": 1}
    assert node_check.last_json_line("nothing") is None


def test_pick_healthy_prefers_the_runs_own_idle_nodes():
    nodes = [
        NodeState(name="n1", state="idle"),
        NodeState(name="n2", state="idle", flags=frozenset({"DRAIN"}), reason="longrun:sdc:r:1"),
        NodeState(name="n3", state="allocated"),
        NodeState(name="n4", state="idle"),
    ]
    assert diagnose.pick_healthy(nodes, exclude=["n2"], prefer=["n3", "n4"]) == "n4"
    assert diagnose.pick_healthy(nodes, exclude=["n1", "n4"]) is None


def _node_check_line(verdict: str) -> str:
    probe = {"verdict": verdict, "fingerprint": "ab" * 8, "expected_fingerprint": "ab" * 8}
    return json.dumps({"node": "n2", "verdict": verdict, "probe": probe, "dcgm": None})


@pytest.mark.parametrize(
    ("answers", "tries", "verdict"),
    [
        # srun cut off (a restarting slurmctld): no JSON line; the second try answers and decides
        (
            [
                CommandResult(
                    exit_code=1, stdout="", stderr="srun: error: Unable to contact slurm controller"
                ),
                CommandResult(exit_code=0, stdout="{}", stderr=""),
            ],
            2,
            "fail",
        ),
        # node_check answered (with an error of the probe's own): not run again
        (
            [
                CommandResult(exit_code=1, stdout="{}", stderr=""),
                CommandResult(exit_code=0, stdout="{}", stderr=""),
            ],
            1,
            "error",
        ),
        # ran to its timeout (srun_step.TIMED_OUT): a hang is evidence, and a second would cost as much
        (
            [
                CommandResult(exit_code=124, stdout="", stderr="longrun: timed out after 60 s"),
                CommandResult(exit_code=0, stdout="{}", stderr=""),
            ],
            1,
            "error",
        ),
        # cut off twice: error, after ATTEMPTS tries
        (
            [
                CommandResult(exit_code=1, stdout="", stderr="cut off"),
                CommandResult(exit_code=1, stdout="", stderr="cut off again"),
            ],
            2,
            "error",
        ),
    ],
)
def test_a_diagnostic_that_never_answered_runs_once_more(monkeypatch, answers, tries, verdict) -> None:
    """The fault matrix's re-enter x slurmctld: slurmctld killed while the diagnostic ran, srun cut off,
    and the node's verdict was `error`, which says nothing about the node. `ops.run_on_drained_node`
    (longrun's own, real-cluster tested in tests/slurm/test_scenarios.py) is replaced by its answers here:
    the retry is `diagnose`'s decision on what came back, and timing a controller kill inside a diagnostic
    is the chaos cell's job."""
    from longrun.slurm import ops

    lines = {0: _node_check_line("fail"), 1: _node_check_line("error")}
    calls: list[tuple[str, ...]] = []

    def run(client, node, argv, *, verdict, timeout_s, reservation, hold_min):
        result = answers[len(calls)]
        calls.append(argv)
        if result.stdout == "{}":  # node_check answered: its JSON line (fail on a 0 exit, error otherwise)
            result = CommandResult(exit_code=result.exit_code, stdout=lines[result.exit_code], stderr="")
        if result.stdout:
            verdict(result)
        return result

    monkeypatch.setattr(ops, "run_on_drained_node", run)
    d = diagnose.diagnose(
        None,
        node="n2",
        run="r",
        step=3,
        expect="ab" * 8,
        dcgm_level=1,
        timeout_s=60,  # type: ignore[arg-type]
    )
    assert len(calls) == tries == min(tries, diagnose.ATTEMPTS)
    assert d.verdict == verdict, d.summary
    assert ("was run again" in d.summary) == (tries == 2)
