"""The shared field readers of the typed records (`training.records.base`). Pure Python."""

from __future__ import annotations

import json

import pytest

from training.records.fields import opt_float, opt_objects
from training.records.schema import SchemaError


def test_opt_objects_reads_a_list_of_objects_as_written() -> None:
    rounds = [{"round": 1, "verdict": "pass"}, {"round": 2, "reason": None}]
    assert opt_objects("k", {"rounds": rounds}, "rounds") == tuple(rounds)
    assert opt_objects("k", {"rounds": []}, "rounds") == ()
    assert opt_objects("k", {"rounds": None}, "rounds") == ()
    assert opt_objects("k", {}, "rounds") == ()


@pytest.mark.parametrize("value", ["pass", {"round": 1}, ["pass"], [{"round": 1}, 3], 0, ""])
def test_opt_objects_refuses_anything_else_naming_the_field(value: object) -> None:
    with pytest.raises(SchemaError, match="k record field 'rounds' .* is not a list of objects"):
        opt_objects("k", {"rounds": value}, "rounds")


def test_a_record_leaves_out_a_part_that_is_empty_and_nothing_else_that_writes_itself() -> None:
    from training.records.alert import World
    from training.records.base import _empty
    from training.records.incident import Attribution

    assert _empty(Attribution()) and _empty(Attribution.from_json({}))
    assert not _empty(Attribution(node="n2"))
    assert not _empty(Attribution.from_json({"node": None}))  # a null the writer set is kept
    assert not _empty(World())  # writes its own JSON but is no part: always written
    assert _empty(None) and _empty(()) and _empty({}) and not _empty(0)


@pytest.mark.parametrize("value", [3, 0, -7, 1767225600, 3.0, 0.5, -2.25, 1767225600.5])
def test_opt_float_gives_a_number_back_as_written(value: float) -> None:
    got = opt_float("k", {"t": value}, "t")
    assert got == value and type(got) is type(value)  # 3 stays 3, 3.0 stays 3.0
    assert opt_float("k", {"t": None}, "t") is None and opt_float("k", {}, "t") is None


@pytest.mark.parametrize("value", [True, False, "3", [3], {"t": 3}])
def test_opt_float_refuses_anything_else_naming_the_field(value: object) -> None:
    with pytest.raises(SchemaError, match="k record field 't' .* is not a number"):
        opt_float("k", {"t": value}, "t")


def _same_text(cls: type, obj: dict) -> None:
    text = json.dumps(obj)
    assert json.dumps(cls.from_json(json.loads(text)).to_json()) == text


def test_records_with_whole_numbers_read_and_write_back_the_same_text() -> None:
    """Optional number fields of a record and of a plain dataclass record (both read with opt_float)."""
    from training.records.job import CheckRecord, Save
    from training.segment import Segment

    stamp = {"schema_version": 1}
    _same_text(
        CheckRecord,
        {**stamp, "kind": "check", "run": "r", "step": 3, "check": "recompute", "verdict": "pass", "rank": 0}
        | {"duration_s": 0.5, "loss": 3},
    )
    _same_text(
        Save,
        {**stamp, "kind": "save", "run": "r", "step": 5, "ok": True, "error": None, "time": 1767225600}
        | {"duration_s": 2},
    )
    segment = {"run": "r", "segment_id": "7.0-r0", "job_id": "7", "restart_count": 0, "start_step": 0}
    segment |= {"resumed_from": None, "started_at": 1767225600, "world_size": 2, "nodes": ["n1", "n2"]}
    segment |= {"first_step": None, "first_healthy_step": None, "first_healthy_time": 1767225610}
    segment |= {"last_step": None, "ended_at": 1767225700, "exit": None, **stamp, "kind": "segment"}
    _same_text(Segment, segment)


def test_a_part_names_its_record_in_errors_by_a_class_attribute() -> None:
    """`Part.ERROR_KIND` says which record a part's errors name (the incident's parts: `incident <PART>`);
    no part overrides `error_kind` for a constant."""
    from longrun.monitor.event import Carry, MonitorEvent
    from longrun.nodes.outcome import NodeProbe, NodeReturn

    from training.records.base import Part
    from training.records.incident import Attribution

    named = {Carry: "monitor_event", MonitorEvent: "monitor_event", NodeProbe: "node_probe"}
    named |= {NodeReturn: "node_return", Attribution: "incident attribution"}
    for cls, kind in named.items():
        assert cls.error_kind() == kind and "error_kind" not in vars(cls), cls
        assert cls.ERROR_KIND == ("" if cls is Attribution else kind), cls
    assert "error_kind" in vars(Part)
    with pytest.raises(SchemaError, match="node_probe record field 'node' = 3 is not a string"):
        NodeProbe.from_json({"node": 3, "clean": True})
    with pytest.raises(
        SchemaError, match="monitor_event record field 'carry.promoted' .* not a list of objects"
    ):
        Carry.from_json({"promoted": 1})
    with pytest.raises(SchemaError, match="incident attribution record field 'node' = 3 is not a string"):
        Attribution.from_json({"node": 3})


def test_a_run_report_reads_its_orchestrator_section_as_written_and_an_old_or_odd_one_as_empty() -> None:
    from training.records.job import Report

    base = {
        "schema_version": 1,
        "kind": "report",
        "run": "r",
        "final_step": 9,
        "final_fingerprint": "ab",
        "time": 1,
    }
    seg = {"job_id": 7, "start_step": 0, "end_step": 9, "ended": "completed"}
    report = Report.from_json(
        {**base, "orchestrator": {"attempt": 1, "promoted_steps": [4, 8], "segments": [seg]}}
    )
    assert report.orchestrator.promoted_steps == (4, 8)
    assert report.orchestrator.segments == (seg,)
    assert report.to_json()["orchestrator"]["promoted_steps"] == [4, 8]  # kept as written
    for odd in ({**base}, {**base, "orchestrator": None}, {**base, "orchestrator": "x"}):
        assert Report.from_json(odd).orchestrator.promoted_steps == ()
        assert Report.from_json(odd).orchestrator.segments == ()
    odd_lists = Report.from_json({**base, "orchestrator": {"promoted_steps": "48", "segments": {"a": 1}}})
    assert odd_lists.orchestrator.promoted_steps == () and odd_lists.orchestrator.segments == ()


def test_a_timeline_entry_shown_reads_as_from_json_and_one_that_does_not_read_keeps_its_fields() -> None:
    from training.records.orchestrator import TimelineEvent

    entry = {"event": "drained", "time": 1767225600, "node": "n2"}
    assert TimelineEvent.shown(entry) == TimelineEvent.from_json(entry)
    assert TimelineEvent.shown("opened") == TimelineEvent(event="opened", time=None)  # the oldest form
    odd = TimelineEvent.shown({"time": "yesterday", "node": "n2"})
    assert (odd.event, odd.time, dict(odd.details)) == ("", None, {"time": "yesterday", "node": "n2"})
    odd = TimelineEvent.shown({"event": 3, "time": 5})
    assert (odd.event, odd.time, dict(odd.details)) == ("", 5, {"event": 3})
    assert dict(TimelineEvent.shown(7).details) == {"entry": 7}


def test_a_manifest_file_entry_reads_as_written_and_an_odd_one_as_empty() -> None:
    from training.records.job import FileEntry

    entry = {"name": "model.pt", "sha256": "ab" * 32, "size": 1024}  # as the saver writes it
    assert FileEntry.shown(entry) == FileEntry(name="model.pt", sha256="ab" * 32, size=1024)
    assert FileEntry.shown({"key": "runs/r/checkpoints/x/model.pt"}).key == "runs/r/checkpoints/x/model.pt"
    odd = FileEntry.shown({"name": 3, "key": None, "sha256": ["x"], "size": True})
    assert odd == FileEntry()
    assert FileEntry.shown("model.pt") == FileEntry() and FileEntry.shown(None) == FileEntry()


def test_the_audit_names_a_file_by_its_key_else_its_name_else_nothing() -> None:
    from longrun.audit.table import _file_key

    from training.records import schema

    assert _file_key("r", 4, {"key": "runs/r/x/model.pt", "name": "n"}) == "runs/r/x/model.pt"
    assert (
        _file_key("r", 4, {"name": "model.pt"})
        == schema.run_prefix("r") + schema.checkpoint_dir(4) + "model.pt"
    )
    assert _file_key("r", 4, {"key": 7}) == "" and _file_key("r", 4, "model.pt") == ""


def test_a_part_shown_leaves_out_only_the_fields_that_do_not_read() -> None:
    from training.records.diagnosis import Probe, ProbeResult

    written = {"node": "n2", "verdict": "pass", "fingerprint": "ab", "threads": 8, "host": "h"}
    assert ProbeResult.shown(written) == ProbeResult.from_json(written)
    odd = ProbeResult.shown({"node": "n2", "threads": "eight", "fingerprint": 3, "host": "h"})
    assert odd.to_json() == {"node": "n2", "host": "h"}
    nested = Probe.shown({"verdict": "fail", "result": {"fingerprint": 3}, "exit_code": 1})
    assert nested.to_json() == {"verdict": "fail", "exit_code": 1}
    assert ProbeResult.shown(["x"]) == ProbeResult() and ProbeResult.shown(None) == ProbeResult()
