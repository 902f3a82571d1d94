"""The tests' name for the package's one Airflow REST client (`longrun.airflow_rest`).

api = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
api.wait_dag_parsed("smoke")
api.unpause("smoke")
run_id = api.trigger("smoke", conf={"x": 1})
assert api.wait_run("smoke", run_id) == "success"
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from longrun.airflow_rest import TERMINAL_RUN_STATES, AirflowApiError
from longrun.airflow_rest import AirflowRest as AirflowApi

__all__ = ["TERMINAL_RUN_STATES", "AirflowApi", "AirflowApiError", "trigger_retrying"]


def trigger_retrying(api: AirflowApi, dag_id: str, conf: Mapping[str, Any], tries: int = 4) -> str:
    """Trigger with a run id of our own, retried on a 5xx (on 2 busy cores SQLite answers "database is
    locked" now and then); a 409 means an earlier try went through. Never two runs."""
    run_id = f"manual__{dag_id}-{uuid.uuid4().hex[:10]}"
    for i in range(tries):
        try:
            return api.trigger(dag_id, conf, run_id=run_id)
        except AirflowApiError as e:
            if "HTTP 409" in str(e):
                return run_id
            if "HTTP 5" not in str(e) or i == tries - 1:
                raise
            time.sleep(3.0)
    return run_id
