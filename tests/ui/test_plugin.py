"""The Airflow plugin: found through its entry point, and shaped as Airflow 3.3 reads plugins."""

from __future__ import annotations

from importlib.metadata import entry_points

from longrun.airflow_plugin import URL_PREFIX, LongrunPlugin


def test_entry_point_names_the_plugin():
    (ep,) = [e for e in entry_points(group="airflow.plugins") if e.name == "longrun"]
    assert ep.load() is LongrunPlugin


def test_fastapi_app_is_mounted_outside_airflows_prefixes():
    (app,) = LongrunPlugin.fastapi_apps
    assert app["url_prefix"] == URL_PREFIX == "/longrun"
    assert app["name"] and app["app"] is not None
    reserved = ["/api/v2", "/ui", "/execution", "/auth", "/pluginsv2"]
    assert not any(URL_PREFIX.startswith(p) for p in reserved)


def test_external_views_validate_against_airflows_model():
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    views = [ExternalViewResponse.model_validate(v) for v in LongrunPlugin.external_views]
    assert {v.destination for v in views} == {"nav", "dag_run"}
    for v in views:
        assert not v.href.startswith("/"), "relative hrefs: the UI resolves them against its base URL"
        assert v.href.startswith(URL_PREFIX.lstrip("/"))
    (run_tab,) = [v for v in views if v.destination == "dag_run"]
    assert "{DAG_ID}" in run_tab.href and "{RUN_ID}" in run_tab.href
