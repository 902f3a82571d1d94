"""The node page (same history as `longrun nodes show`) and the per-route permission checks of the app."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.routing import APIRoute
from helpers.local_store import use_local_store
from longrun.cli import main as longrun_main
from longrun.health import history as h
from longrun.slurm.models import NodeState
from longrun.ui.app import NODES_DAG_ID, create_app

from training.store.local import LocalDirStore


@pytest.fixture
def store(tmp_path, monkeypatch):
    s = use_local_store(tmp_path, monkeypatch)
    h.record(
        s, "n2", h.SUSPECTED, "inc-1", run="drill-1", incident_id="inc-1", evidence={"check": "recompute"}
    )
    h.record(
        s, "n2", h.DIAGNOSED, "inc-1", run="drill-1", incident_id="inc-1", verdict="fail",
        reason="longrun:diag-fail:drill-1:25", evidence={"fingerprint": "<b>ab</b>", "expected": "cd"},
    )  # fmt: skip
    h.record(s, "n2", h.REPLACE, "inc-1", run="drill-1", incident_id="inc-1", reason="a diagnostic failed")
    return s


def build(store, auth=None) -> FastAPI:
    nodes = [
        NodeState(name="n2", state="idle", flags=frozenset({"DRAIN"}), reason="longrun:diag-fail:drill-1:25")
    ]
    app = create_app(store=lambda: store, nodes=lambda: lambda: nodes, auth=auth)
    outer = FastAPI()
    outer.mount("/longrun", app)
    return outer


def get(app, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get(path, headers=headers)

    return asyncio.run(go())


def test_node_page_shows_the_cli_history(store, capsys):
    r = get(build(store), "/longrun/nodes/n2")
    assert r.status_code == 200
    html = r.text
    # Its first and only incident, marked by a failed diagnostic: named for that, not a repeat offender.
    assert "failed diagnostic: marked for replacement, never returned automatically" in html
    assert "repeat offender" not in html and "longrun:diag-fail:drill-1:25" in html
    assert "<td class='bad'>idle+DRAIN</td>" in html  # as the run page's nodes table shows it
    assert "&lt;b&gt;ab&lt;/b&gt;" in html and "<b>ab</b>" not in html  # evidence is escaped
    assert "href='/longrun/runs/drill-1#incident-inc-1'" in html
    assert longrun_main(["nodes", "show", "n2"]) == 0
    cli_kinds = [line.split("  ")[1] for line in capsys.readouterr().out.splitlines()[1:]]
    page_kinds = [row.split("</td><td>")[1] for row in html.split("<tr class='event'>")[1:]]
    assert page_kinds == cli_kinds == ["suspected", "diagnosed", "marked_for_replacement"]
    assert get(build(store), "/longrun/nodes").status_code == 200
    assert get(build(store), "/longrun/nodes/n%5B1-4%5D").status_code == 404


def test_the_node_page_says_repeat_offender_only_for_repeated_suspicions(store):
    """Two incidents naming n3, every diagnosis passed: the policy's suspicion limit marks it, and the page
    says so in those words; one suspicion and a passed diagnosis mark nothing."""
    h.record(store, "n3", h.SUSPECTED, "inc-a", run="r", incident_id="inc-a")
    h.record(store, "n3", h.DIAGNOSED, "inc-a", run="r", incident_id="inc-a", verdict="pass")
    once = get(build(store), "/longrun/nodes/n3").text
    assert "never returned automatically" not in once
    h.record(store, "n3", h.SUSPECTED, "inc-b", run="r", incident_id="inc-b")
    twice = get(build(store), "/longrun/nodes/n3").text
    assert "repeat offender: marked for replacement, never returned automatically" in twice
    assert "suspected 2 times within 30 days (limit 2)" in twice


def test_every_route_checks_the_permission_of_its_dag(store):
    """With an auth that admits only a token per DAG, each route answers 403 without it and names the
    DAG it reads; a route without a check would answer 200 here."""
    asked: list[str | None] = []

    def auth(dag_id: str | None) -> list:
        async def check(request: Request) -> None:
            target = dag_id or request.path_params.get("dag_id")
            asked.append(target)
            if request.headers.get("x-dag") != target:
                raise HTTPException(403, f"no read on {target}")

        return [Depends(check)]

    app = build(store, auth=auth)
    inner = create_app(store=lambda: store, auth=auth)
    paths = {r.path for r in inner.routes if isinstance(r, APIRoute)}
    expect = {
        "/": "training_run",
        "/runs/drill-1": "training_run",
        "/runs/drill-1/health.json": "training_run",
        "/runs/drill-1/loss.png": "training_run",
        "/runs/drill-1/incidents/x/y.png": "training_run",
        "/runbooks/x": "training_run",
        "/dag_runs/sdc_incident/r1": "sdc_incident",
        "/nodes": NODES_DAG_ID,
        "/nodes/n2": NODES_DAG_ID,
    }
    assert len(paths) == len(expect), paths  # a new route needs a line here
    for path, dag in expect.items():
        assert get(app, f"/longrun{path}").status_code == 403, path
        assert get(app, f"/longrun{path}", headers={"x-dag": "other"}).status_code == 403, path
        assert asked[-1] == dag, path


def test_run_page_marks_incidents_open_or_closed(tmp_path):
    from longrun.incident import closing

    from ui.drill_records import fill_drill

    s = LocalDirStore(tmp_path / "drill")
    fill_drill(s)
    app = build(s)
    assert '<span class="badge b-open">open</span>' in get(app, "/longrun/runs/drill-1").text
    for rec in record_ids(s):
        closing.close(s, run="drill-1", incident_id=rec, by="ops", reason="tested")
    html = get(app, "/longrun/runs/drill-1").text
    assert '<span class="badge b-closed">closed</span>' in html and "b-open" not in html


def record_ids(store) -> list[str]:
    return [
        i.key.rsplit("/", 1)[1][: -len(".json")]
        for i in store.list("runs/drill-1/incidents/")
        if i.key.count("/") == 3 and i.key.endswith(".json")
    ]
