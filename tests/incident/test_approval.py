"""Approval texts escape what comes from alerts: a hostile alert string renders as inert text in the
sdc_incident approval bodies (the DAG's own templates, through the DAG's own Jinja environment)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from longrun.incident import attribution
from longrun.incident.approval import safe_text
from markdown_it import MarkdownIt

from training.records import schema

DAGS = Path(__file__).resolve().parents[2] / "dags"
HOSTILE = "n2](http://evil.example/x) <img src=x onerror=alert(1)> **APPROVE NOW** `rm -rf`\x1b[2J"


@pytest.fixture(scope="module")
def dag(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("AIRFLOW_HOME", str(tmp_path_factory.mktemp("airflow_home")))
    mp.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    from airflow.dag_processing.dagbag import DagBag

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bag = DagBag(dag_folder=str(DAGS / "sdc_incident.py"))
    yield bag.dags["sdc_incident"]
    mp.undo()


class FakeTI:
    """Only what the bodies call: xcom_pull of the attribute and pick outputs."""

    def __init__(self, values):
        self.values = values

    def xcom_pull(self, task_ids):
        return self.values[task_ids]


def rendered_html(dag, task_id: str, values) -> str:
    body = dag.get_task(task_id).body
    text = dag.get_template_env().from_string(body).render(ti=FakeTI(values))
    return MarkdownIt("commonmark", {"html": True}).render(str(text))


def test_hostile_alert_strings_are_inert_in_the_approval_bodies(dag):
    alert = schema.record(
        "alert", run="r", step=5, check="recompute", suspect_ranks=[1], suspect_nodes=[HOSTILE], evidence={}
    )
    att = attribution.attribute(alert).to_dict()
    assert HOSTILE in att["node"]  # the attack reaches the attribution unchanged
    pick = {"step": 3, "key": "k", "why": HOSTILE}
    for task_id in ("approve_drain", "approve_relaunch"):
        html = rendered_html(dag, task_id, {"attribute": att, "pick_checkpoint": pick})
        assert "<img" not in html and "<a " not in html and "<strong>" not in html and "<code>" not in html, (
            html
        )
        assert "\x1b" not in html
        assert "evil.example" in html  # shown, as text


def test_safe_text_clips_and_keeps_plain_text():
    assert safe_text("n2") == "n2"
    assert safe_text("a" * 5000).endswith("\\[clipped\\]")
    assert safe_text({"node": "n2"}) == '\\{"node"\\: "n2"\\}'.replace('"', "&quot;")
