"""The read model of a run over a real local-directory store: checkpoint states, the suspect rule, votes,
incidents, attempts, and bad records reported instead of raised."""

from __future__ import annotations

import json

import pytest
from longrun import runview
from longrun.checkpoints import catalog
from longrun.runview import RunView

from training import segment
from training.records import schema
from training.store.interface import put_json
from training.store.local import LocalDirStore

RUN = "rv1"
T = 1764430000.0
WORLD = {"nodes": ["n1", "n2", "n3"], "ranks": ["n1", "n2", "n3"], "world_size": 3}


def _put(store: LocalDirStore, relative: str, obj: object) -> None:
    put_json(store, schema.store_key(RUN, relative), obj)


def _manifest(step: int, time_: float) -> dict:
    return schema.record(
        "manifest",
        run=RUN,
        step=step,
        files=[],
        fingerprints={},
        weight_vote={"verdict": "pass"},
        coverage={},
        loss=1.0 / step,
        code_version="x",
        world=WORLD,
        time=time_,
    )


@pytest.fixture
def store(tmp_path):
    s = LocalDirStore(tmp_path / "store")
    for step in (10, 20, 30, 40):
        _put(s, schema.manifest_path(step), _manifest(step, T + step))
    _put(
        s,
        schema.validation_path(10, "a"),
        schema.record("validation", run=RUN, step=10, ok=True, errors=[], time=T + 11),
    )
    _put(
        s,
        schema.validation_path(20, "a"),
        schema.record("validation", run=RUN, step=20, ok=False, errors=["hash"], time=T + 21),
    )
    promo = schema.record("promotion", run=RUN, step=10, manifest_key="k", seq=1, time=T + 12)
    _put(s, schema.promotion_history_path(1), promo)
    _put(s, schema.PROMOTED_POINTER_PATH, promo)
    # The incident at step 25 marks everything after 10 saved before T+35 as suspect: 20 and 30, not 40.
    _put(
        s,
        schema.suspect_path("i1"),
        schema.record("suspect", run=RUN, after_step=10, reason="i1", time=T + 35),
    )
    return s


def test_checkpoint_states_follow_the_gate(store) -> None:
    view = RunView(store, RUN)
    states = {c.step: (c.state, c.current, c.validation_errors) for c in view.checkpoints()}
    assert states == {
        10: ("promoted", True, ()),
        20: ("suspect", False, ("hash",)),
        30: ("suspect", False, ()),
        40: ("saved", False, ()),
    }
    assert view.world_size == 3 and view.problems == []


def test_the_read_model_and_the_gate_apply_one_suspect_rule(store) -> None:
    view = RunView(store, RUN)
    marks = catalog.suspect_marks(store, RUN)
    for step, m in view.manifests.items():
        assert (view.demoting_mark(step, m.time) is not None) == (
            catalog.demoting_mark(marks, step, m.time) is not None
        )


def test_bad_records_are_problems_not_exceptions(store) -> None:
    store.put_bytes(schema.store_key(RUN, schema.manifest_path(50)), b"not json")
    _put(store, "alerts/00000017-recompute-x.json", {"schema_version": 1, "kind": "alert", "run": RUN})
    _put(store, schema.manifest_path(60), _manifest(61, T))  # a manifest whose step is not its key's
    view = RunView(store, RUN)
    assert sorted(view.manifests) == [10, 20, 30, 40]
    assert view.alerts == ()
    assert len(view.problems) == 3, view.problems
    assert any("step-00000050" in p for p in view.problems)
    assert any("lacks field" in p for p in view.problems)


def test_votes_incidents_and_attempts(store) -> None:
    check = schema.record(
        "check", run=RUN, step=5, check="weight_vote", verdict="pass", rank=0, duration_s=0.0
    )
    store.put_bytes(
        schema.store_key(RUN, schema.check_batch_path(1, 5, 0)), (json.dumps(check) + "\n").encode()
    )
    inc = schema.record(
        "incident",
        run=RUN,
        incident_id="i1",
        alert={"step": 25},
        timeline=[{"event": "opened", "time": T + 30}],
        mode="act",
        status="open",
    )
    _put(store, schema.incident_path("i1"), inc)
    store.put_bytes(schema.store_key(RUN, "incidents/i1/loss.png"), b"\x89PNG")  # an attachment, not a record
    seg = segment.Segment(
        run=RUN,
        segment_id="1.0-r0",
        job_id="1",
        restart_count=0,
        start_step=0,
        resumed_from=None,
        started_at=T,
        world_size=3,
        nodes=("n1", "n2", "n3"),
    )
    _put(store, segment.SEGMENTS_DIR + "1.0-r0.json", seg.to_json())
    view = RunView(store, RUN)
    assert view.votes() == (runview.Vote(step=5, agreeing=3, replicas=3),)
    assert [(k, i.status) for k, i in view.incidents] == [("incidents/i1.json", "open")]
    assert [a.segment_id for a in view.attempts] == ["1.0-r0"]
    assert view.problems == []


def test_run_names_are_checked(store) -> None:
    with pytest.raises(ValueError, match="run name"):
        RunView(store, "../etc")
    assert runview.list_runs(store) == [RUN]
