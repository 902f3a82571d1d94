"""The run-health FastAPI app, mounted by the Airflow plugin under /longrun in the API server.

Routes (relative to the mount point):

    /                                    the runs in the store
    /runs/{run}                          the run-health page (reloads itself while the run is live)
    /runs/{run}/health.json              the same data as JSON
    /runs/{run}/loss.png                 loss over steps with check events and incidents marked
    /runs/{run}/fingerprints.png         replica weight-fingerprint agreement
    /runs/{run}/incidents/{id}/{name}    a plot saved with an incident record
    /runbooks/{name}                     a runbook from runbooks/, rendered
    /dag_runs/{dag_id}/{run_id}          redirect from an Airflow DAG run to its run's page
    /nodes                               the nodes with a history
    /nodes/{node}                        a node's history (timeline, standing) and its Slurm state

Inside Airflow every route checks Airflow's permission on the DAG whose data it shows (the JWT cookie
the UI sets, or a bearer token): run pages and runbooks read runs of `training_run`; node pages read runs
of `sdc_incident` (node history comes from incidents and `node_return`); the DAG-run redirect reads the
DAG it names. No route is without a check (tests/ui/test_node_page.py asserts it). Handlers are plain `def`:
the store and Slurm calls block, so FastAPI runs them in its thread pool.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from longrun.health import history
from longrun.health.policy import NodePolicy, standing
from longrun.runview import list_runs
from longrun.slurm import validate
from longrun.ui import page, plots
from longrun.ui.data import NodeSource, load_run_health
from longrun.ui.node_page import node_html, nodes_index_html
from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import NotFound, ObjectStore, StoreError

DAG_ID = "training_run"
NODES_DAG_ID = "sdc_incident"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def default_runbooks_dir() -> Path:
    """LONGRUN_RUNBOOKS_DIR, else runbooks/ at the repository root (the package is installed editable)."""
    env = os.environ.get("LONGRUN_RUNBOOKS_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "runbooks"


def default_nodes() -> NodeSource | None:
    """The Slurm client's node listing when this server has a Slurm config, else None."""
    if not os.environ.get("SLURM_CONF"):
        return None

    def nodes() -> Sequence[Any]:
        from longrun.slurm.factory import make_client

        return make_client(backend="cli").nodes()

    return nodes


def airflow_can_read_runs_of(dag_id: str | None) -> Callable[[Request], Any]:
    """Airflow's own check, as its routes do it: a logged-in user (JWT cookie or bearer token) allowed
    to read runs of `dag_id` (None: the route's `dag_id` path parameter). Imported per request:
    airflow.api_fastapi pulls in the whole API server, which the scheduler and the tests that load
    plugins must not pay for."""

    async def can_read(request: Request) -> None:
        import asyncio

        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
        from airflow.api_fastapi.core_api import security

        target = dag_id or request.path_params.get("dag_id")
        if not isinstance(target, str) or not _NAME.match(target):
            raise HTTPException(404, "no such DAG")
        bearer = await security.bearer_scheme(request)
        user = await security.get_user(request, None, bearer)
        check = security.requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=target)
        await asyncio.to_thread(check, request, user)

    return can_read


async def airflow_can_read_runs(request: Request) -> None:
    """Read access to `training_run` runs (kept for callers of the former app-wide check)."""
    await airflow_can_read_runs_of(DAG_ID)(request)


def airflow_auth(dag_id: str | None = DAG_ID) -> list[Any]:
    return [Depends(airflow_can_read_runs_of(dag_id))]


def airflow_run_target(dag_id: str, run_id: str) -> tuple[str | None, str | None]:
    """(longrun run name, incident id or None) of an Airflow DAG run, from its conf: `run_name` (or
    `run`); an `sdc_incident` run also names its incident (`incident_id`, or the alert key's stem)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        dr = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        conf = dict(dr.conf or {}) if dr is not None else {}
    return target_from_conf(conf)


def target_from_conf(conf: dict[str, Any]) -> tuple[str | None, str | None]:
    name = conf.get("run_name") or conf.get("run")
    incident = conf.get("incident_id")
    if not incident and isinstance(conf.get("alert_key"), str) and conf["alert_key"].endswith(".json"):
        incident = conf["alert_key"].rsplit("/", 1)[-1][: -len(".json")]
    return (name if isinstance(name, str) else None, incident if isinstance(incident, str) else None)


def create_app(
    *,
    store: Callable[[], ObjectStore] = store_from_env,
    nodes: Callable[[], NodeSource | None] = default_nodes,
    runbooks_dir: Callable[[], Path] = default_runbooks_dir,
    auth: Callable[[str | None], list[Any]] | None = airflow_auth,
    run_target: Callable[[str, str], tuple[str | None, str | None]] = airflow_run_target,
) -> FastAPI:
    """Build the app. Every collaborator is a factory called per request, so the environment the API
    server was started with is read late, and tests pass a local store and no Airflow auth.

    Why one function: it is the app's route table. Each handler is a short closure over this app's
    collaborators (store, nodes, runbooks, run_target) and its permission check; FastAPI reads each
    handler's own signature, so module-level handlers would need a wrapper per route all the same, and
    the routes are easiest to audit (every one has its `guard`) when listed together."""
    app = FastAPI(title="longrun run health", docs_url=None, redoc_url=None, openapi_url=None)

    def guard(dag_id: str | None) -> list[Any]:
        """The permission check of a route that shows data of `dag_id` (None: the path's dag_id)."""
        return auth(dag_id) if auth else []

    def base(request_root: str) -> str:
        return request_root.rstrip("/")

    def checked(run: str) -> str:
        try:
            return schema.check_run_name(run)
        except schema.SchemaError as e:
            raise HTTPException(404, str(e)) from None

    def health(run: str):  # noqa: ANN202
        try:
            return load_run_health(store(), checked(run), nodes=nodes())
        except StoreError as e:
            raise HTTPException(503, f"store unavailable: {e}") from None

    @app.get("/", response_class=HTMLResponse, dependencies=guard(DAG_ID))
    def index(request: Request) -> str:
        s = store()
        try:
            runs = list_runs(s)
        except StoreError as e:
            raise HTTPException(503, f"store unavailable: {e}") from None
        return page.index_html(runs, base=base(request.scope.get("root_path", "")), store=s.describe())

    @app.get("/runs/{run}", response_class=HTMLResponse, dependencies=guard(DAG_ID))
    def run_page(run: str, request: Request) -> str:
        h = health(run)
        return page.run_html(h, base=base(request.scope.get("root_path", "")), store=store().describe())

    @app.get("/runs/{run}/health.json", dependencies=guard(DAG_ID))
    def run_json(run: str) -> JSONResponse:
        return JSONResponse(dataclasses.asdict(health(run)))

    @app.get("/runs/{run}/{name}.png", dependencies=guard(DAG_ID))
    def run_plot(run: str, name: str) -> Response:
        draw = plots.PLOTS.get(f"{name}.png")
        if draw is None:
            raise HTTPException(404, f"no plot named {name!r}; known: {sorted(plots.PLOTS)}")
        return Response(draw(health(run)), media_type="image/png", headers={"Cache-Control": "no-store"})

    @app.get("/runs/{run}/incidents/{incident_id}/{name}", dependencies=guard(DAG_ID))
    def incident_file(run: str, incident_id: str, name: str) -> Response:
        if not (_NAME.match(incident_id) and _NAME.match(name) and name.endswith(".png")):
            raise HTTPException(404, "not an incident plot")
        try:
            data = store().get_bytes(plots.incident_plot_key(checked(run), incident_id, name))
        except NotFound:
            raise HTTPException(404, f"no plot {name} for incident {incident_id}") from None
        except StoreError as e:
            raise HTTPException(503, f"store unavailable: {e}") from None
        return Response(data, media_type="image/png")

    @app.get("/runbooks/{name}", response_class=HTMLResponse, dependencies=guard(DAG_ID))
    def runbook(name: str, request: Request) -> str:
        stem = name[:-3] if name.endswith(".md") else name
        if not _NAME.match(stem):
            raise HTTPException(404, f"runbook name {name!r} is not a plain name")
        path = runbooks_dir() / f"{stem}.md"
        if not path.is_file():
            raise HTTPException(404, f"no runbook {stem}.md in {runbooks_dir()}")
        return page.runbook_html(stem, path.read_text(), base=base(request.scope.get("root_path", "")))

    @app.get("/dag_runs/{dag_id}/{run_id}", dependencies=guard(None))
    def from_dag_run(dag_id: str, run_id: str, request: Request) -> Response:
        name, incident = run_target(dag_id, run_id)
        root = base(request.scope.get("root_path", ""))
        if not name:
            text = f"DAG run {run_id!r} of {dag_id!r} names no longrun run (no run_name in its conf)."
            return HTMLResponse(
                page.message_html("No run for this DAG run", text, base=root), status_code=404
            )
        anchor = f"#incident-{incident}" if incident and _NAME.match(incident) else ""
        return RedirectResponse(f"{root}/runs/{checked(name)}{anchor}", status_code=307)

    @app.get("/nodes", response_class=HTMLResponse, dependencies=guard(NODES_DAG_ID))
    def nodes_index(request: Request) -> str:
        s = store()
        try:
            rows = []
            for name in history.nodes(s):
                evs = history.events(s, name)
                rows.append((name, history.state(evs), len(evs)))
        except (StoreError, ValueError) as e:
            raise HTTPException(503, f"node history unavailable: {e}") from None
        return nodes_index_html(rows, base=base(request.scope.get("root_path", "")))

    @app.get("/nodes/{node}", response_class=HTMLResponse, dependencies=guard(NODES_DAG_ID))
    def node_view(node: str, request: Request) -> str:
        try:
            validate.node("node", node)
        except ValueError as e:
            raise HTTPException(404, str(e)) from None
        evs, error = history.safe_events(store(), node)
        live = None
        source = nodes()
        if source is not None:
            try:
                live = next((n for n in source() if n.name == node), None)
            except Exception as e:  # the page still shows the history without Slurm
                error = f"{error + '; ' if error else ''}Slurm: {e}"
        st = standing(node, evs, NodePolicy())
        return node_html(
            node, evs, st, base=base(request.scope.get("root_path", "")), slurm=live, error=error
        )

    return app
