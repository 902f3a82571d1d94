"""The run-health data layer over a local store filled with schema records."""

from __future__ import annotations

import json

import pytest
from helpers.check_batches import put_check_batches
from helpers.counting_store import CountingStore
from longrun import runview
from longrun.runview import list_runs
from longrun.slurm.models import NodeState
from longrun.ui import data
from longrun.ui.model import CheckEvent
from longrun.votes import Vote as VotePoint

from training.records import schema
from training.records.job import CheckRecord
from training.store.interface import put_json
from training.store.local import LocalDirStore
from ui.drill_records import ALERT_STEP, T0, fill_drill, loss_at


@pytest.fixture
def store(tmp_path):
    return LocalDirStore(tmp_path / "store")


def nodes():
    return [
        NodeState(
            name="n2", state="idle", flags=frozenset({"DRAIN"}), reason="longrun:sdc-diag-fail:drill-1:25"
        ),
        NodeState(name="n1", state="allocated"),
        NodeState(name="n3", state="idle", flags=frozenset({"DRAIN"}), reason="longrun:sdc:other-run:3"),
        NodeState(name="n4", state="down", flags=frozenset({"NOT_RESPONDING"}), reason="admin: fan"),
    ]


def test_progress_report_and_series(store):
    fill_drill(store)
    h = data.load_run_health(store, "drill-1", now=T0 + 260)
    assert (h.step, h.total_steps, h.finished) == (40, 40, True)
    assert h.final_fingerprint == "00ff00ff00ff00ff"
    assert h.heartbeat_age_s == pytest.approx(60)
    assert h.step_time_s == 0.05
    steps = [s for s, _ in h.loss_series]
    assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] == 40
    # the relaunch's values win for re-trained steps (21..25 were written twice)
    assert dict(h.loss_series)[22] == pytest.approx(loss_at(22) + 0.001)
    assert h.problems == ()


def test_check_timeline_has_passes_failures_and_the_alert(store):
    fill_drill(store)
    h = data.load_run_health(store, "drill-1")
    counts = h.check_counts()
    assert counts["recompute"] == {"pass": 2, "fail": 1, "alert": 1}
    assert counts["weight_vote"] == {"pass": 4}
    assert counts["finite"]["pass"] == 40
    (alert,) = h.alerts
    assert (alert.step, alert.check, alert.suspect_nodes) == (ALERT_STEP, "recompute", ("n2",))
    assert [c.step for c in h.checks] == sorted(c.step for c in h.checks)


def test_checkpoint_states(store):
    fill_drill(store)
    h = data.load_run_health(store, "drill-1")
    states = {c.step: c.state for c in h.checkpoints}
    # 24 was saved after the last known-good step (20) and before the suspect record: demoted.
    assert states == {10: "promoted", 20: "promoted", 24: "suspect", 30: "promoted", 40: "validated"}
    assert [c.step for c in h.checkpoints if c.current] == [30]


def test_invalid_checkpoint_shows_its_errors(store):
    fill_drill(store)
    put_json(
        store,
        schema.store_key("drill-1", schema.validation_path(40, "v2")),
        schema.record(
            "validation", run="drill-1", step=40, ok=False, errors=["model.pt: sha256 differs"], time=T0 + 999
        ),
    )
    (ck,) = [c for c in data.load_run_health(store, "drill-1").checkpoints if c.step == 40]
    assert ck.state == "invalid" and ck.validation_errors == ("model.pt: sha256 differs",)


def test_incident_view(store):
    ident = fill_drill(store)
    (inc,) = data.load_run_health(store, "drill-1").incidents
    assert inc.incident_id == ident
    assert (inc.mode, inc.status, inc.verdict, inc.step, inc.check) == (
        "act",
        "relaunched",
        "fail",
        25,
        "recompute",
    )
    assert [e["event"] for e in inc.timeline] == [
        "opened",
        "frozen",
        "attributed",
        "drained",
        "diagnosed",
        "relaunched",
    ]
    assert inc.runbooks == ("recompute-mismatch",)
    facts = dict(inc.facts)
    assert facts["lost steps"] == "5" and facts["alert to running again"] == "6.5 s"
    assert "20" in facts["restart checkpoint"] and "exclude=['n2']" in facts["relaunch"]


def _vote_check(step: int, verdict: str, evidence: dict, **extra) -> CheckRecord:
    return CheckRecord(
        run="r",
        step=step,
        check="weight_vote",
        verdict=verdict,
        rank=0,
        duration_s=0.0,
        evidence=evidence,
        **extra,
    )


def test_votes_pass_and_fail():
    world = 3
    ok = runview.vote(_vote_check(10, "pass", {"fingerprint": "a"}), world)
    assert ok == VotePoint(step=10, agreeing=3, replicas=3)
    bad = runview.vote(
        _vote_check(12, "fail", {"fingerprints_by_rank": {"0": "a", "1": "a", "2": "b"}}, suspect_ranks=(2,)),
        world,
    )
    assert bad == VotePoint(step=12, agreeing=2, replicas=3, dissenters=(2,))
    split = runview.vote(_vote_check(14, "fail", {"fingerprints_by_rank": {"0": "a", "1": "b"}}), world)
    assert split is not None and split.agreeing == 0 and split.dissenters == ()


def test_a_sharded_vote_counts_agreement_within_each_shard():
    """HSDP 3 x 2: shard 0 on ranks 0, 2, 4 (rank 4 flipped), shard 1 on ranks 1, 3, 5. Fingerprints of
    different shards never compare: five ranks agree with their shard's majority, one dissents."""
    by_rank = {"0": "a", "1": "b", "2": "a", "3": "b", "4": "c", "5": "b"}
    shards = {"0": {"ranks": [0, 2, 4], "majority": "a", "dissent": [4]}}
    flip = runview.vote(_vote_check(15, "fail", {"fingerprints_by_rank": by_rank, "shards": shards}), 6)
    assert flip == VotePoint(step=15, agreeing=5, replicas=6, dissenters=(4,))
    undecided = {**shards, "1": {"ranks": [1, 3, 5], "majority": None, "dissent": []}}
    for odd in (undecided, {}, "garbled"):
        none = runview.vote(_vote_check(15, "fail", {"fingerprints_by_rank": by_rank, "shards": odd}), 6)
        assert none == VotePoint(step=15, agreeing=0, replicas=6)


def test_node_states_mark_this_runs_drains(store):
    fill_drill(store)
    h = data.load_run_health(store, "drill-1", nodes=nodes)
    by = {n.name: n for n in h.nodes}
    assert [n.name for n in h.nodes] == ["n1", "n2", "n3", "n4"]
    assert by["n2"].state == "idle+DRAIN" and by["n2"].ours and by["n2"].this_run
    assert by["n3"].ours and not by["n3"].this_run
    assert not by["n4"].ours and by["n4"].state == "down+NOT_RESPONDING"
    assert h.nodes_error is None


def test_slurm_errors_are_shown_not_raised(store):
    fill_drill(store)

    def broken():
        raise OSError("slurmctld: connection refused")

    h = data.load_run_health(store, "drill-1", nodes=broken)
    assert h.nodes == () and "connection refused" in h.nodes_error
    assert "SLURM_CONF" in data.load_run_health(store, "drill-1").nodes_error


def test_bad_records_are_listed_and_skipped(store):
    fill_drill(store, finished=False)
    store.put_bytes(
        schema.store_key("drill-1", "checks/00000030-00000031-r000.jsonl"), b'{"kind": "check"}\nnot json\n'
    )
    rank_1 = schema.record(
        "check", run="drill-1", step=31, check="finite", verdict="pass", rank=1, duration_s=0.1
    )
    store.put_bytes(  # a record of another rank than its key's: no evidence, and a problem
        schema.store_key("drill-1", "checks/00000031-00000031-r000.jsonl"),
        (json.dumps(rank_1) + "\n").encode(),
    )
    store.put_bytes(schema.store_key("drill-1", "alerts/00000099-finite-x.json"), b"[]")
    h = data.load_run_health(store, "drill-1")
    assert len(h.problems) == 4, h.problems
    assert not [c for c in h.checks if c.step == 31 and c.check == "finite" and c.verdict == "pass"][1:]
    assert len(h.alerts) == 1 and not h.finished and h.step == 33


def test_empty_run_and_listing(store):
    assert list_runs(store) == []
    h = data.load_run_health(store, "nothing-yet")
    assert (h.step, h.checks, h.checkpoints, h.incidents, h.loss_series) == (None, (), (), (), ())
    fill_drill(store, "a-run")
    fill_drill(store, "b-run")
    assert list_runs(store) == ["a-run", "b-run"]


def test_bad_run_name_is_refused(store):
    with pytest.raises(schema.SchemaError, match="run name"):
        data.load_run_health(store, "../etc")


def test_model_validation_names_the_field():
    with pytest.raises(ValueError, match="verdict = 'maybe'"):
        CheckEvent(step=1, check="finite", verdict="maybe")
    with pytest.raises(ValueError, match="agreeing = 4"):
        VotePoint(step=1, agreeing=4, replicas=3)


def test_an_old_incident_with_a_top_level_verdict_and_runbook_still_shows_them(store):
    """The oldest incident records kept the verdict and the runbook at the top level."""
    old = {
        "schema_version": 1,
        "kind": "incident",
        "run": "old-1",
        "incident_id": "inc-old",
        "alert": {"check": "finite", "step": 3},
        "timeline": ["opened"],
        "mode": "act",
        "verdict": "fail",
        "runbook": "runbooks/nonfinite-loss.md",
        "runbooks": ["runbooks/recompute-mismatch.md", "runbooks/nonfinite-loss.md"],
    }
    put_json(store, schema.store_key("old-1", "incidents/inc-old.json"), old)
    (inc,) = data.load_run_health(store, "old-1").incidents
    assert inc.verdict == "fail"
    assert inc.runbooks == ("nonfinite-loss", "recompute-mismatch")
    put_json(
        store, schema.store_key("old-1", "incidents/inc-old.json"), {**old, "verdict": 3, "runbook": ["x"]}
    )
    (inc,) = data.load_run_health(store, "old-1").incidents
    assert inc.verdict is None and inc.runbooks == ("recompute-mismatch", "nonfinite-loss")


def _long_run(store: LocalDirStore, run: str, age: int) -> None:
    """`age` steps of passes on 2 ranks (a vote every 10 steps), a failed recompute and its alert at step
    50, and a heartbeat at `age`."""
    recs = [
        schema.record(
            "check",
            run=run,
            step=s,
            check=c,
            verdict="pass",
            rank=r,
            duration_s=0.001,
            time=T0 + s,
            **({"evidence": {"fingerprint": "ab"}} if c == "weight_vote" else {}),
        )
        for s in range(1, age + 1)
        for r in (0, 1)
        for c in ("finite", "weight_vote")
        if c == "finite" or s % 10 == 0
    ]
    recs.append(
        schema.record(
            "check",
            run=run,
            step=50,
            check="recompute",
            verdict="fail",
            rank=0,
            duration_s=0.001,
            time=T0 + 50,
            suspect_ranks=[1],
            suspect_nodes=["n2"],
        )
    )
    put_check_batches(store, run, recs, every=20)
    alert = schema.record(
        "alert",
        run=run,
        step=50,
        check="recompute",
        suspect_ranks=[1],
        suspect_nodes=["n2"],
        evidence={},
        time=T0 + 50,
    )
    put_json(store, schema.store_key(run, schema.alert_path(50, "recompute", "r000-1")), alert)
    progress = schema.record(
        "progress", run=run, step=age, loss=1.0, step_time_s=0.05, time=T0 + age, total_steps=10 * age
    )
    put_json(store, schema.store_key(run, schema.PROGRESS_PATH), progress)


def test_the_page_reads_the_same_at_any_age_and_shows_the_newest_steps_and_every_alert(tmp_path):
    """Issue 31: what the page reads does not grow with the run's age. The same run at 300 and at 3,000
    steps: the same listings and batch reads. It shows the check records of the newest
    RECENT_CHECK_STEPS steps, and the alert raised long before them."""
    window = runview.RECENT_CHECK_STEPS
    reads = {}
    for age in (300, 3000):
        store = LocalDirStore(tmp_path / str(age))
        _long_run(store, "long", age)
        counting = CountingStore(store)
        h = data.load_run_health(counting, "long", now=T0 + age)  # type: ignore[arg-type]
        reads[age] = (counting.count["list"], sum("/checks/" in key for key in counting.got))
        assert h.checks_window == window
        passes = [c for c in h.checks if c.verdict == "pass"]
        assert {c.step for c in passes} == set(range(age - window + 1, age + 1))
        assert [(a.step, a.check) for a in h.alerts] == [(50, "recompute")]  # older than the window
        assert [c for c in h.checks if c.verdict == "fail"] == []  # its failed record is not read
        assert sorted({v.step for v in h.votes}) == list(range(age - window + 10, age + 1, 10))
        assert h.problems == ()
    assert reads[300] == reads[3000], reads
    # the newest 200 steps are 10 batches of 20 on each rank; reading every batch would be 150 per rank
    assert reads[3000][1] == 2 * window // 20, reads


def test_recent_checks_of_a_run_without_a_step_yet_reads_the_first_steps(store):
    put_check_batches(
        store,
        "young",
        [
            schema.record(
                "check", run="young", step=s, check="finite", verdict="pass", rank=0, duration_s=0.1
            )
            for s in range(1, 5)
        ],
    )
    view = runview.RunView(store, "young")
    assert view.newest_step is None
    assert [c.step for c in view.recent_checks(3)] == [1, 2]
    with pytest.raises(ValueError, match="steps=0"):
        view.recent_checks(0)
