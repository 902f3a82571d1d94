"""dcgmi diag: level selection, the command line, and the JSON parser.

DCGM is absent on this machine (no GPU). The JSON inputs in tests/incident/data/ are HAND-WRITTEN
FIXTURES in the documented `dcgmi diag --json` shape, not captured from a real run; a real capture should
replace them on a GPU host (NVIDIA publishes no stable schema and asks consumers to pin per release).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from longrun.health import dcgm

DATA = Path(__file__).parent / "data"


def test_level_follows_the_evidence():
    assert dcgm.level_for(check="finite") == 2
    assert dcgm.level_for(check="recompute") == 3
    assert dcgm.level_for(check="weight_vote") == 3
    assert dcgm.level_for(check="finite", prior_incidents=1) == 4
    assert dcgm.level_for(check="recompute", persistent=True) == 4


def test_command():
    assert dcgm.command(3) == ("dcgmi", "diag", "-r", "3", "-j")
    assert dcgm.command(2, gpu_ids=(0, 3)) == ("dcgmi", "diag", "-r", "2", "-j", "-i", "0,3")
    with pytest.raises(ValueError, match="level=5"):
        dcgm.command(5)
    with pytest.raises(ValueError, match="gpu_ids"):
        dcgm.command(3, gpu_ids=(-1,))


def test_failing_run_names_the_test_and_gpu():
    v = dcgm.parse((DATA / "dcgmi_diag_r3_fail.json").read_text(), level=3)
    assert not v.passed
    fails = [f for f in v.failures if f.status == "fail"]
    assert [(f.category, f.test, f.gpu) for f in fails] == [("Hardware", "Diagnostic", "3")]
    assert fails[0].error_ids == (95,)
    assert "12 errors" in fails[0].message and "GEMM" in fails[0].message
    warns = [f for f in v.failures if f.status == "warn"]
    assert [(f.test, f.gpu) for f in warns] == [("Targeted Stress", "3")]
    assert v.version == "3.3.5"
    assert v.tests_run == 4 + 4 + 4 + 4 + 4  # skips are not counted
    assert "FAILED Diagnostic@gpu3" in v.summary()
    assert v.to_dict()["failures"][0]["test"] == "Diagnostic"


def test_passing_run_in_the_newer_shape():
    v = dcgm.parse((DATA / "dcgmi_diag_r2_pass.json").read_text(), level=2)
    assert v.passed and v.failures == () and v.tests_run == 4
    assert v.version == "4.1.0"
    assert v.summary() == "dcgmi diag -r 2: passed (4 results)"


def test_a_warning_alone_does_not_fail():
    text = '{"DCGM Diagnostic": {"test_categories": [{"category": "Stress", "tests": [{"name": "Targeted Power", "results": [{"gpu_id": 0, "status": "Warn", "warnings": [{"warning": "power capped"}]}]}]}]}}'
    v = dcgm.parse(text)
    assert v.passed and v.failures[0].status == "warn" and v.failures[0].message == "power capped"


def test_runtime_error_fails():
    v = dcgm.parse('{"DCGM GPU Diagnostic": {"runtime_error": "Unable to connect to the host engine"}}')
    assert not v.passed and v.runtime_error == "Unable to connect to the host engine"
    assert "could not run" in v.summary()


def test_describe_reads_the_verdict_as_the_incident_record_keeps_it():
    """node_check prints `to_dict()` and the record keeps it: the one line for people comes from that."""
    failing = dcgm.parse((DATA / "dcgmi_diag_r3_fail.json").read_text(), level=3)
    assert dcgm.describe(failing.to_dict()) == "dcgmi diag -r 3: FAILED Diagnostic@gpu3"  # not the warning
    passing = dcgm.parse((DATA / "dcgmi_diag_r2_pass.json").read_text(), level=2)
    assert dcgm.describe(passing.to_dict()) == "dcgmi diag -r 2: passed (4 results)"
    assert dcgm.describe(None) == "dcgmi absent on the node"
    # node_check's own failure records (a timeout, unparseable output) carry no level and no failures
    assert dcgm.describe({"passed": False, "runtime_error": "timed out after 5 s"}) == (
        "dcgmi diag could not run: timed out after 5 s"
    )
    # an overall Fail with no failing result named is still a failure, never "passed"
    overall = dcgm.parse('{"DCGM Diagnostic": {"test_categories": [], "Overall Result": "Fail"}}', level=1)
    assert not overall.passed and overall.summary() == "dcgmi diag -r 1: FAILED Fail"


def test_log_lines_before_the_json_are_skipped():
    v = dcgm.parse('Successfully ran diagnostic\n{"DCGM Diagnostic": {"test_categories": []}}')
    assert v.passed and v.tests_run == 0


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("Error: unable to establish a connection", "no JSON object"),
        ("{not json", "not valid JSON"),
        ('{"something": {}}', "lacks"),
        ('{"DCGM Diagnostic": {"version": "4"}}', "neither test_categories"),
    ],
)
def test_bad_output_is_a_clear_error(text, match):
    with pytest.raises(dcgm.DcgmParseError, match=match):
        dcgm.parse(text)


def test_describe_reads_a_verdict_as_an_incident_record_keeps_it():
    """Literal `dcgm` objects as node_check printed them and incident records keep them."""
    failed = {
        "passed": False,
        "level": 3,
        "tests_run": 8,
        "runtime_error": None,
        "version": "3.3.5",
        "failures": [
            {
                "category": "Hardware",
                "test": "Diagnostic",
                "gpu": "3",
                "status": "fail",
                "message": "x",
                "error_ids": [],
            },
            {
                "category": "Stress",
                "test": "Memory",
                "gpu": "1",
                "status": "warn",
                "message": "",
                "error_ids": [],
            },
            {
                "category": "Hardware",
                "test": "PCIe",
                "gpu": None,
                "status": "fail",
                "message": "",
                "error_ids": [],
            },
        ],
        "overall_result": "Fail",
    }
    assert dcgm.describe(failed) == "dcgmi diag -r 3: FAILED Diagnostic@gpu3, PCIe"
    assert (
        dcgm.describe({"passed": True, "level": 2, "failures": []}) == "dcgmi diag -r 2: passed (0 results)"
    )
    assert dcgm.describe({"passed": False, "runtime_error": "timed out", "level": 4}) == (
        "dcgmi diag could not run: timed out"
    )
    assert (
        dcgm.describe({"passed": False, "level": 1, "overall_result": "Fail"})
        == "dcgmi diag -r 1: FAILED Fail"
    )
    assert dcgm.describe(None) == "dcgmi absent on the node"


@pytest.mark.parametrize(
    "odd", [{"passed": "yes", "level": 3}, {"level": 3}, {"passed": 1, "failures": "fail"}, []]
)
def test_a_verdict_that_does_not_say_passed_true_never_reads_as_passed(odd):
    from longrun.health import node_check

    assert "FAILED" in dcgm.describe(odd)
    assert node_check.combine({"verdict": "pass"}, odd) == "fail"
