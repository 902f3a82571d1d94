"""The HTML: the status an operator reads first, node colours, and escaping of record text."""

from __future__ import annotations

import dataclasses

import pytest
from longrun.ui import data, page

from training.store.local import LocalDirStore
from ui.drill_records import T0, fill_drill


@pytest.fixture
def store(tmp_path):
    return LocalDirStore(tmp_path / "store")


def status(h) -> str:
    html = page.run_html(h, base="/longrun", store="test")
    return html.split('id="run-status">', 1)[1].split("<", 1)[0]


def test_status_follows_the_run(store):
    fill_drill(store, finished=False)
    live = data.load_run_health(store, "drill-1", now=T0 + 160)
    assert status(live) == "training"  # the incident was relaunched: the run is training again
    assert status(dataclasses.replace(live, heartbeat_age_s=600.0)) == "heartbeat stale"
    (inc,) = live.incidents
    still_open = dataclasses.replace(live, incidents=(dataclasses.replace(inc, status="open"),))
    assert status(still_open) == "incident"
    assert status(dataclasses.replace(live, incidents=())) == "incident"  # an alert nobody handled yet
    fill_drill(store)
    assert status(data.load_run_health(store, "drill-1")) == "finished"


def test_node_colours():
    assert page.node_class("idle+DRAIN") == "bad"
    assert page.node_class("down+NOT_RESPONDING") == "bad"
    assert page.node_class("mixed+MAINTENANCE+RESERVED") == "warn"
    assert page.node_class("allocated") == "ok"


def test_record_text_is_escaped(store):
    fill_drill(store)
    h = data.load_run_health(store, "drill-1")
    (inc,) = h.incidents
    evil = dataclasses.replace(inc, timeline=({"event": "<script>alert(1)</script>", "time": T0},))
    html = page.run_html(dataclasses.replace(h, incidents=(evil,)), base="/longrun", store="<b>s</b>")
    assert "<script>alert(1)" not in html and "&lt;script&gt;" in html
    assert "<b>s</b>" not in html


def test_the_timeline_is_in_time_order_and_an_entry_that_does_not_read_still_shows(store):
    fill_drill(store)
    h = data.load_run_health(store, "drill-1")
    (inc,) = h.incidents
    odd = (
        {"event": "drained", "time": T0 + 5, "node": "n2"},
        {"event": "opened", "time": T0},
        {"time": "yesterday", "note": "no event"},  # an entry no writer writes: shown, never fatal
        {"event": "later", "time": None},
    )
    html = page.run_html(
        dataclasses.replace(h, incidents=(dataclasses.replace(inc, timeline=odd),)), base="/l", store="s"
    )
    table = html.split("<table class='timeline'>", 1)[1].split("</table>", 1)[0]
    rows = table.split("<tr>")[2:]
    assert "opened" in rows[0] and "+0.0" in rows[0]
    assert "drained" in rows[1] and "+5.0" in rows[1] and "&quot;node&quot;: &quot;n2&quot;" in rows[1]
    assert "yesterday" in rows[2] + rows[3] and "no event" in rows[2] + rows[3]
    assert "later" in rows[2] + rows[3]
