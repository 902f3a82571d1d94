"""The run-health app over HTTP (in process, through httpx's ASGI transport; Airflow's login is
exercised by the browser test, so these build the app without it)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI
from longrun.slurm.models import NodeState
from longrun.ui import plots
from longrun.ui.app import create_app

from training.store.local import LocalDirStore
from ui.drill_records import fill_drill


@pytest.fixture
def store(tmp_path):
    s = LocalDirStore(tmp_path / "store")
    fill_drill(s)
    return s


@pytest.fixture
def runbooks(tmp_path):
    d = tmp_path / "runbooks"
    d.mkdir()
    (d / "recompute-mismatch.md").write_text("# Recompute mismatch\n\n<script>x</script>\n\n1. `sinfo -R`\n")
    return d


@pytest.fixture
def client(store, runbooks):
    nodes = [NodeState(name="n2", state="idle", flags=frozenset({"DRAIN"}), reason="longrun:sdc:drill-1:25")]
    app = create_app(
        store=lambda: store,
        nodes=lambda: lambda: nodes,
        runbooks_dir=lambda: runbooks,
        auth=None,
        run_target=lambda dag_id, run_id: {
            "manual__1": ("drill-1", None),
            "incident__7": ("drill-1", "00000025-recompute-r000-1764430025"),
        }.get(run_id, (None, None)),
    )
    outer = FastAPI()
    outer.mount("/longrun", app)  # as Airflow mounts it: links must carry the prefix
    return outer


def get(app, path: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get(path)

    return asyncio.run(go())


def test_index_lists_runs(client):
    r = get(client, "/longrun/")
    assert r.status_code == 200
    assert 'href="/longrun/runs/drill-1"' in r.text


def test_run_page_shows_every_section(client):
    r = get(client, "/longrun/runs/drill-1")
    assert r.status_code == 200
    html = r.text
    for needle in (
        "Run health: drill-1",
        'src="/longrun/runs/drill-1/loss.png"',
        'src="/longrun/runs/drill-1/fingerprints.png"',
        "id='alerts'",
        "id='checks'",
        "id='checkpoints'",
        "id='nodes'",
        "idle+DRAIN",
        "this run",
        "href='/longrun/runbooks/recompute-mismatch'",
        "relaunched",
        'id="run-status">finished',
    ):
        assert needle in html, needle


def test_plots_and_json(client, store):
    for name in ("loss", "fingerprints"):
        r = get(client, f"/longrun/runs/drill-1/{name}.png")
        assert r.status_code == 200 and r.headers["content-type"] == "image/png"
        assert r.content.startswith(b"\x89PNG")
    assert get(client, "/longrun/runs/drill-1/nope.png").status_code == 404
    j = get(client, "/longrun/runs/drill-1/health.json").json()
    assert j["run"] == "drill-1" and j["step"] == 40 and len(j["incidents"]) == 1


def test_incident_plots_are_served_and_linked(client, store):
    (ident,) = [k.split("/")[-1][:-5] for k in (i.key for i in store.list("runs/drill-1/incidents/"))]
    plots.render_incident_plots(store, "drill-1", ident)
    html = get(client, "/longrun/runs/drill-1").text
    url = f"/longrun/runs/drill-1/incidents/{ident}/loss.png"
    assert f'src="{url}"' in html
    assert get(client, url).content.startswith(b"\x89PNG")
    assert get(client, f"/longrun/runs/drill-1/incidents/{ident}/nothing.png").status_code == 404


def test_runbook_is_rendered_and_escaped(client):
    r = get(client, "/longrun/runbooks/recompute-mismatch")
    assert r.status_code == 200
    assert "<h1>Recompute mismatch</h1>" in r.text and "<script>x</script>" not in r.text
    assert get(client, "/longrun/runbooks/..%2Fsecrets").status_code == 404
    assert get(client, "/longrun/runbooks/absent").status_code == 404


def test_dag_run_redirects_to_its_run(client):
    r = get(client, "/longrun/dag_runs/training_run/manual__1")
    assert r.status_code == 307 and r.headers["location"] == "/longrun/runs/drill-1"
    r = get(client, "/longrun/dag_runs/sdc_incident/incident__7")
    assert r.headers["location"] == "/longrun/runs/drill-1#incident-00000025-recompute-r000-1764430025"
    r = get(client, "/longrun/dag_runs/training_run/other")
    assert r.status_code == 404 and "names no longrun run" in r.text


def test_bad_run_name_is_404(client):
    assert get(client, "/longrun/runs/..%2F..").status_code == 404


def test_target_from_conf():
    from longrun.ui.app import target_from_conf

    assert target_from_conf({"run_name": "r1", "steps": 3}) == ("r1", None)
    assert target_from_conf(
        {"run_name": "r1", "alert_key": "runs/r1/alerts/00000010-recompute-r000-17.json"}
    ) == (
        "r1",
        "00000010-recompute-r000-17",
    )
    assert target_from_conf({}) == (None, None)
