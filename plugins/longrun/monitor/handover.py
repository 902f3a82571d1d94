"""Hand-overs between the two DAGs, as TriggerDagRunOperators whose run id makes them idempotent.

HandOverOperator (training_run -> sdc_incident): conf = the alert the monitor returned plus this run's
params; run id `incident__<incident id>`, so a rerun (or a second monitor seeing the same alert) finds
the existing incident run and is skipped instead of opening a second incident. The triggered run's note
names the alert and its runbook, so the Airflow UI links the runbook from the incident run itself.

ReenterOperator (sdc_incident -> training_run): a new training_run run that attaches to the relaunched
job; run id `<run>__attempt<N>`. The relaunch step recorded that continuation first (run id and conf
alike: longrun.monitor.launches), and the new run's preflight checks its conf against that record.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk.exceptions import AirflowSkipException

from longrun.dagrun_ids import attempt_run_id, incident_run_id
from longrun.monitor.launches import continuation_conf
from longrun.monitor.operator import ALERTED
from longrun.paused import require_unpaused
from longrun.runbooks import runbook_path


class HandOverOperator(TriggerDagRunOperator):
    """Trigger `sdc_incident` with the alert found by the task `monitor_task_id`; skipped when the monitor
    ended without one (then `finish` runs instead)."""

    def __init__(self, *, monitor_task_id: str = "monitor", **kwargs: Any) -> None:
        kwargs.setdefault("trigger_dag_id", "sdc_incident")
        super().__init__(skip_when_already_exists=True, openlineage_inject_parent_info=False, **kwargs)
        self.monitor_task_id = monitor_task_id

    def execute(self, context: Any) -> Any:
        result = context["ti"].xcom_pull(task_ids=self.monitor_task_id)
        if not isinstance(result, dict) or result.get("outcome") != ALERTED:
            raise AirflowSkipException("the monitor ended without an alert: nothing to hand over")
        alert, key = result["alert"], result["alert_key"]
        require_unpaused(
            context["ti"],
            self.trigger_dag_id,
            why=f"the alert {key} would wait in an incident run that never starts",
        )
        params = dict(context["params"])
        self.trigger_run_id = incident_run_id(key)
        self.conf = {
            "run_name": result["run"],
            "alert_key": key,
            "alert": alert,
            "job_id": result["job_id"],
            "run_params": params,
            "alert_seen_at": result.get("seen_at"),
        }
        self.note = (
            f"SDC alert: {alert.get('check')} at step {alert.get('step')} on {alert.get('suspect_nodes')} "
            f"(run {result['run']}, mode {params.get('incident_mode')}). Runbook: {runbook_path(str(alert.get('check')))}"
        )
        self.log.info("handing over to sdc_incident as run %s: %s", self.trigger_run_id, self.note)
        return super().execute(context)


class ReenterOperator(TriggerDagRunOperator):
    """Trigger `training_run` attached to the job the task `relaunch_task_id` started."""

    def __init__(self, *, relaunch_task_id: str = "relaunch", **kwargs: Any) -> None:
        kwargs.setdefault("trigger_dag_id", "training_run")
        super().__init__(skip_when_already_exists=True, openlineage_inject_parent_info=False, **kwargs)
        self.relaunch_task_id = relaunch_task_id

    def execute(self, context: Any) -> Any:
        result = context["ti"].xcom_pull(task_ids=self.relaunch_task_id)
        if not result or result.get("observe"):
            self.log.info("nothing was relaunched (observe mode or no relaunch): not re-entering monitoring")
            return None
        require_unpaused(
            context["ti"],
            self.trigger_dag_id,
            why=f"the relaunched job {result['job_id']} would train with nothing watching it",
        )
        params = continuation_conf(result)  # what the relaunch step recorded (longrun.monitor.launches)
        self.trigger_run_id = attempt_run_id(params["run_name"], params["attempt"])
        self.conf = params
        self.note = f"Relaunch after incident {result.get('incident_id')}: Slurm job {result['job_id']} on {result.get('nodes')}"
        self.log.info("re-entering monitoring as training_run run %s", self.trigger_run_id)
        return super().execute(context)
