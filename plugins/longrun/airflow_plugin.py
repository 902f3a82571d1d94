"""The longrun Airflow plugin: the run-health pages, mounted into the Airflow API server.

Registered through the `airflow.plugins` entry point (pyproject.toml); plugins/.airflowignore keeps
Airflow from also loading the package's files one by one from the plugins folder. Building the app
imports FastAPI only (already loaded by Airflow's API server); the pages read the store and Slurm per
request.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from longrun.ui.app import create_app

#: Where the pages live in the API server (Airflow reserves /api/v2, /ui, /execution, /auth, /pluginsv2).
URL_PREFIX = "/longrun"


class LongrunPlugin(AirflowPlugin):
    """Run-health pages under /longrun, a nav entry, and a "Run health" tab on every DAG run."""

    name = "longrun"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "longrun run health"}]
    # hrefs are relative (no leading slash): the UI resolves them against its own base URL.
    external_views = [
        {
            "name": "Run health",
            "href": "longrun/",
            "destination": "nav",
            "category": "browse",
            "url_route": "longrun-runs",
        },
        {
            "name": "Run health",
            "href": "longrun/dag_runs/{DAG_ID}/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "longrun-run-health",
        },
    ]
