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


def closing_note(h) -> str:
    html = page.run_html(h, base="/longrun", store="test")
    return (
        html.split("class='muted incident-closing'>", 1)[1].split("</p>", 1)[0]
        if "incident-closing" in html
        else ""
    )


def test_an_open_incident_says_when_it_will_close(store):
    """After the relaunched run finished, "open" comes with what it waits for and when it closes; a closed
    incident says nothing more; every open status says who or what closes it."""
    fill_drill(store)
    h = data.load_run_health(store, "drill-1")
    (inc,) = h.incidents
    assert inc.status == "relaunched" and h.finished
    note = closing_note(h)
    assert note.startswith("The relaunched run has finished. Open until the relaunched run has trained")
    assert f"now {h.step - inc.restart_step} steps past its resume point (step {inc.restart_step})" in note
    assert "daily <code>checkpoint_audit</code> (00:00 UTC) then closes it" in note
    assert "longrun incidents close --run drill-1 --incident " + inc.incident_id in note
    closed = dataclasses.replace(h, incidents=(dataclasses.replace(inc, status="closed"),))
    assert closing_note(closed) == ""
    for status_, words in (
        ("observed", "Observe mode acted on nothing"),
        ("ambiguous", "nothing was drained"),
        ("failed", "A step of the incident failed"),
        ("open", "In progress"),
    ):
        other = dataclasses.replace(h, incidents=(dataclasses.replace(inc, status=status_),))
        assert words in closing_note(other), status_


def test_the_pages_healthy_steps_default_is_the_closers():
    from longrun.incident.closing import HEALTHY_STEPS

    assert page.HEALTHY_STEPS_DEFAULT == HEALTHY_STEPS
