"""Incidents close: relaunched and healthy for N steps (no alert since), or by an operator with a reason;
retention then stops holding checkpoints for them (local-directory store)."""

from __future__ import annotations

import json
import time

import pytest
from helpers.local_store import use_local_store
from longrun.cli import main as longrun_main
from longrun.incident import closing, record

from training.records import schema
from training.store.interface import put_json

RUN = "close-1"
KEY = f"runs/{RUN}/alerts/00000015-weight_vote-r001-1.json"


@pytest.fixture
def store(tmp_path, monkeypatch):
    s = use_local_store(tmp_path, monkeypatch)
    alert = schema.record(
        "alert", run=RUN, step=15, check="weight_vote", suspect_ranks=[1], suspect_nodes=["n2"], evidence={}
    )
    rec = record.open_incident(s, run=RUN, alert=alert, alert_key=KEY, mode="act")
    record.add_event(
        s, run=RUN, incident_id=rec["incident_id"], name="picked", fields={"checkpoint": {"step": 10}}
    )
    record.add_event(
        s,
        run=RUN,
        incident_id=rec["incident_id"],
        name="relaunched_running",
        fields={"status": record.RELAUNCHED},
    )
    return s


def progress(store, step: int, t: float) -> None:
    rec = schema.record("progress", run=RUN, step=step, loss=1.0, step_time_s=0.1, time=t)
    put_json(store, schema.store_key(RUN, schema.PROGRESS_PATH), rec)


def test_relaunched_and_healthy_for_n_steps_closes(store):
    iid = schema.incident_id_for(KEY)
    progress(store, 25, time.time() + 1)
    assert closing.close_healthy(store, RUN, healthy_steps=20) == []  # 15 steps past the resume point
    progress(store, 30, time.time() + 2)
    assert closing.close_all_healthy(store, healthy_steps=20) == [f"{RUN}/{iid}"]
    rec = record.load(store, run=RUN, incident_id=iid)
    assert (
        rec["status"] == "closed"
        and rec["closed"]["by"] == "longrun"
        and rec["closed"]["healthy_steps"] == 20
    )
    assert closing.close_healthy(store, RUN, healthy_steps=20) == []  # once


def test_an_alert_after_the_relaunch_keeps_it_open(store):
    progress(store, 60, time.time() + 1)
    later = schema.record(
        "alert", run=RUN, step=40, check="finite", suspect_ranks=[0], suspect_nodes=["n1"], evidence={}
    )
    later["time"] = time.time() + 1
    put_json(store, f"runs/{RUN}/alerts/00000040-finite-r000-2.json", later)
    assert closing.close_healthy(store, RUN, healthy_steps=20) == []


def test_operator_closes_with_a_reason(store, capsys):
    iid = schema.incident_id_for(KEY)
    assert longrun_main(["incidents", "list", "--run", RUN]) == 0
    assert f"{iid}  open" in capsys.readouterr().out
    with pytest.raises(ValueError, match="reason"):
        closing.close(store, run=RUN, incident_id=iid, by="ops", reason="  ")
    assert (
        longrun_main(
            [
                "incidents",
                "close",
                "--run",
                RUN,
                "--incident",
                iid,
                "--reason",
                "vendor swapped GPU",
                "--by",
                "ops",
            ]
        )
        == 0
    )
    rec = json.loads(store.get_bytes(record.record_key(RUN, iid)))
    assert (
        rec["status"] == "closed"
        and rec["closed"]["reason"] == "vendor swapped GPU"
        and rec["closed"]["by"] == "ops"
    )
    assert rec["timeline"][-1]["event"] == "closed"
    capsys.readouterr()
    assert longrun_main(["incidents", "list", "--run", RUN]) == 0
    assert f"{iid}  closed" in capsys.readouterr().out
    assert longrun_main(["incidents", "close", "--run", RUN, "--incident", "nope", "--reason", "x"]) == 1


def test_the_audit_honours_the_closing_threshold(store, monkeypatch):
    """checkpoint_audit's task closes with its Param `healthy_steps`, else the Variable
    `longrun_healthy_steps` (read by Airflow's SDK from its environment-variable backend here), else 20."""
    from airflow.sdk.exceptions import AirflowFailException
    from longrun.tasks.checkpoint_audit import audit_task, closing_threshold

    iid = schema.incident_id_for(KEY)
    monkeypatch.delenv("AIRFLOW_VAR_LONGRUN_HEALTHY_STEPS", raising=False)
    assert closing_threshold({}) == closing.HEALTHY_STEPS == 20
    progress(store, 25, time.time() + 1)  # 15 steps past the resume point
    monkeypatch.setenv("AIRFLOW_VAR_LONGRUN_HEALTHY_STEPS", "16")
    assert closing_threshold({}) == 16
    assert closing.close_all_healthy(store, healthy_steps=closing_threshold({})) == []
    # the Param wins over the Variable
    assert closing_threshold({"healthy_steps": 15}) == 15
    try:
        audit_task({"healthy_steps": 15, "sample_size": 0}, "manual__threshold", store=store)
    except AirflowFailException:
        pass  # this store holds an incident and nothing else: the audit's verdict is not the point here
    rec = record.load(store, run=RUN, incident_id=iid)
    assert rec["status"] == "closed" and rec["closed"]["healthy_steps"] == 15, rec.get("closed")
    for bad, params in (
        ("0", {}),
        ("many", {}),
        (None, {"healthy_steps": 0}),
        (None, {"healthy_steps": True}),
    ):
        if bad is not None:
            monkeypatch.setenv("AIRFLOW_VAR_LONGRUN_HEALTHY_STEPS", bad)
        with pytest.raises(ValueError, match="healthy_steps"):
            closing_threshold(params)
    with pytest.raises(AirflowFailException, match="Param healthy_steps=0"):
        audit_task({"healthy_steps": 0}, "manual__bad", store=store)
