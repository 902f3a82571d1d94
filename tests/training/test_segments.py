"""Proof of resume: each incarnation of the trainer records where it started, its first healthy step and
its end; a drill's fault leaves a record when (and only when) it fires. Real processes, 3 gloo ranks."""

from __future__ import annotations

import json

import pytest

from training import segment
from training.segment import FaultFired, Segment


def _segments(run) -> list[Segment]:
    files = sorted((run.run_dir / "segments").glob("*.json"))
    return segment.ordered([Segment.from_json(p.read_text()) for p in files])


def _faults(run) -> list[FaultFired]:
    return [FaultFired.from_json(p.read_text()) for p in sorted((run.run_dir / "faults").glob("*.json"))]


def test_a_relaunch_records_where_it_resumed_and_what_was_lost(launch):
    common = ["--steps", "12", "--seed", "3", "--recompute-every", "3", "--vote-every", "3"]
    nodes = "n1,n2,n3"
    first = launch([*common, "--checkpoint-every", "4", "--fault", "nan:7:1"], name="run", nodes=nodes,
                   env={"SLURM_JOB_ID": "101"})  # fmt: skip
    assert first.rcs == [93] * 3, first.log()
    (seg0,) = _segments(first)
    assert (seg0.start_step, seg0.resumed_from, seg0.first_step) == (0, None, 1)
    assert (seg0.last_step, seg0.exit, seg0.first_healthy_step) == (7, "sdc_verdict", 1)
    (fired,) = _faults(first)
    assert (fired.fault, fired.step, fired.rank, fired.node) == ("nan", 7, 1, "n2")
    # the store has the same records
    stored = first.store_dir / "runs" / "run" / seg0.relative_path
    assert Segment.from_json(stored.read_bytes()) == seg0

    ckpt = first.run_dir / "checkpoints" / "step-00000004"
    second = launch([*common, "--checkpoint-every", "4", "--resume-from", str(ckpt)], name="run", nodes=nodes,
                    env={"SLURM_JOB_ID": "102"})  # fmt: skip
    assert second.rcs == [0] * 3, second.log()
    before, after = _segments(second)
    assert before == seg0
    assert (after.start_step, after.resumed_from, after.first_step) == (4, str(ckpt), 5)
    assert (after.first_healthy_step, after.last_step, after.exit) == (5, 12, "done")
    assert after.first_healthy_time is not None and after.first_healthy_time >= after.started_at
    assert segment.lost_steps(before, after) == 3
    # the heartbeat says the same
    progress = json.loads((second.run_dir / "progress" / "latest.json").read_text())
    assert (progress["start_step"], progress["resumed_from"], progress["segment"]) == (
        4,
        str(ckpt),
        after.segment_id,
    )
    assert _faults(second) == [fired]  # a relaunch never re-injects


def test_a_fault_that_cannot_reach_its_target_leaves_no_record(launch):
    # sick-node on a node that is not in the run: it trains cleanly, and nothing says the drill fired
    run = launch(["--steps", "4", "--recompute-every", "2", "--fault", "sick-node:2:n9"], nodes="n1,n2,n3")
    assert run.rcs == [0] * 3, run.log()
    assert _faults(run) == []
    (seg,) = _segments(run)
    assert (seg.exit, seg.last_step) == ("done", 4)


def _seg(**kw) -> dict:
    base = Segment(run="r", segment_id="7.0-r0", job_id="7", restart_count=0, start_step=0,
                   resumed_from=None, started_at=1.0, world_size=3, nodes=("n1", "n2", "n3"))  # fmt: skip
    return {**base.to_json(), **kw}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"start_step": "4"}, "start_step"),
        ({"start_step": True}, "start_step"),
        ({"kind": "progress"}, "kind"),
        ({"schema_version": 2}, "schema_version"),
        ({"segment_id": "../x"}, "segment_id"),
        ({"exit": "maybe"}, "exit"),
        ({"first_step": 0}, "first_step"),
        ({"nodes": "n1"}, "nodes"),
    ],
)
def test_segment_records_are_checked_on_read(change, field):
    assert Segment.from_json(json.dumps(_seg())).segment_id == "7.0-r0"
    bad = _seg(**change)
    with pytest.raises(ValueError, match=field):
        Segment.from_json(json.dumps(bad))
    missing = _seg()
    del missing["run"]
    with pytest.raises(ValueError, match="run"):
        Segment.from_json(missing)


def test_fault_records_round_trip_and_are_checked():
    rec = FaultFired(run="r", fault="nan", step=3, rank=1, node="n2", time=2.0, spec="nan:3:1")
    assert FaultFired.from_json(json.dumps(rec.to_json())) == rec
    assert rec.relative_path == "faults/00000003-nan-r001-2000.json"
    # a replay of the step (NVRx in-job restart) fires again: a second record, not an overwrite
    again = FaultFired(run="r", fault="nan", step=3, rank=1, node="n2", time=9.5, spec="nan:3:1")
    assert again.relative_path != rec.relative_path
    with pytest.raises(ValueError, match="step"):
        FaultFired.from_json({**rec.to_json(), "step": "3"})
    with pytest.raises(ValueError, match="kind"):
        FaultFired.from_json({**rec.to_json(), "kind": "segment"})


def test_a_replayed_fault_keeps_the_first_injection_before_the_alert():
    """The recovery's `fault_injected` is the newest injection before the alert; a replay after the alert
    (an NVRx in-job restart of the same step) must not hide the first one."""
    from longrun.incident.recovery import measure

    from training.records.incident import RestartCheckpoint
    from training.records.orchestrator import Incident as IncidentRecord

    first = FaultFired(run="r", fault="nan", step=3, rank=1, node="n2", time=10.0, spec="nan:3:1")
    replay = FaultFired(run="r", fault="nan", step=3, rank=1, node="n2", time=30.0, spec="nan:3:1")
    incident = IncidentRecord(
        run="r",
        incident_id="i",
        alert={"time": 12.0},
        timeline=(),
        mode="act",
        checkpoint=RestartCheckpoint(step=2),
    )
    ms = measure(incident, [], [first, replay])["milestones_s"]
    assert ms["fault_injected"] == -2.0
