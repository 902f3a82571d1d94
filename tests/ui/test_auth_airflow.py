"""The run-health app inside the real Airflow API server refuses anonymous and forged requests on every
route, and admits a logged-in user."""

from __future__ import annotations

import pytest
import requests
from helpers.airflow_api import AirflowApi

pytestmark = [pytest.mark.airflow]

ROUTES = (
    "/",
    "/runs/r1",
    "/runs/r1/health.json",
    "/runs/r1/loss.png",
    "/runs/r1/incidents/i1/p.png",
    "/runbooks/node-return",
    "/dag_runs/sdc_incident/manual__1",
    "/nodes",
    "/nodes/n1",
)


def test_every_route_refuses_anonymous_and_forged_requests(airflow_stack):
    base = f"{airflow_stack.url}/longrun"
    forged = {"Authorization": "Bearer eyJhbGciOiJIUzUxMiJ9.eyJzdWIiOiJhZG1pbiJ9.AAAA"}
    for path in ROUTES:
        anon = requests.get(base + path, timeout=30, allow_redirects=False)
        assert anon.status_code in (401, 403), (path, anon.status_code, anon.text[:200])
        bad = requests.get(base + path, headers=forged, timeout=30, allow_redirects=False)
        assert bad.status_code in (401, 403), (path, bad.status_code, bad.text[:200])
    token = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password).token
    ok = requests.get(f"{base}/nodes", headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert ok.status_code == 200, ok.text[:500]
