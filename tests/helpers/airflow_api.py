"""The tests' name for the package's one Airflow REST client (`longrun.airflow_rest`).

api = AirflowApi.login(airflow_stack.url, airflow_stack.user, airflow_stack.password)
api.wait_dag_parsed("smoke")
api.unpause("smoke")
run_id = api.trigger("smoke", conf={"x": 1})
assert api.wait_run("smoke", run_id) == "success"
"""

from __future__ import annotations

from longrun.airflow_rest import TERMINAL_RUN_STATES, AirflowApiError
from longrun.airflow_rest import AirflowRest as AirflowApi

__all__ = ["TERMINAL_RUN_STATES", "AirflowApi", "AirflowApiError"]
