"""training_run's @task bodies: Airflow context in, lifecycle functions called, plain dicts out.

The finish of a relaunch also records its incident's time to recover (longrun.incident.recovery): the run
lifecycle knows nothing of incidents, the task that joins the two does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from longrun import runclaim
from longrun.hooks.slurm import SlurmHook
from longrun.incident import recovery
from longrun.monitor import lifecycle
from longrun.monitor.operator import ALERTED, COMPLETED
from longrun.paused import INCIDENT_DAG, MODES_NEEDING_INCIDENTS, require_unpaused
from longrun.slurm.spec import JobTag
from training.store.factory import store_from_env

log = logging.getLogger("longrun.training_run")


def preflight_task(params: Mapping[str, Any], ti: Any) -> dict[str, Any]:
    try:
        lifecycle.check_declared(params)  # Airflow adds undeclared conf keys to params: refuse them here
    except lifecycle.UndeclaredParamError as e:
        raise AirflowFailException(f"refused before anything reached Slurm: {e}") from None
    mode = params.get("incident_mode")
    if mode in MODES_NEEDING_INCIDENTS:
        require_unpaused(
            ti, INCIDENT_DAG, why=f"an SDC alert of this run (incident_mode {mode}) would never be handled"
        )
    out = lifecycle.preflight(store_from_env(), SlurmHook().client, params)
    claim_run_name(params, ti)  # last: a run refused for another reason leaves the name free
    log.info(
        "preflight ok: run %s, %s node(s), usable %s, run dir %s, drill %s, attach %s",
        out["spec"]["run_name"],
        out["spec"]["nodes"],
        out["usable_nodes"],
        out["run_dir"],
        out["drill"],
        out["attach_job_id"],
    )
    return out


def claim_run_name(params: Mapping[str, Any], ti: Any) -> None:
    """One run, one name (longrun.runclaim): refused unless this DAG run holds the name or continues it."""
    run = str(params["run_name"])
    attach = params.get("attach_job_id")
    continues = attach is not None and int(params.get("attempt") or 0) >= 1
    if continues:
        # A continuation must name this run's own job (launch names the job after the run).
        try:
            job = SlurmHook().client.job(int(str(attach)))
        except Exception:  # noqa: BLE001 - gone already: the monitor sees it end; nothing to confuse
            job = None
        if job is not None and (job.name != run or not job.comment.startswith("longrun/")):
            raise AirflowFailException(
                f"refused: attach_job_id {attach} is job {job.name!r}, not a job of run {run!r}"
            )
    try:
        runclaim.claim(store_from_env(), run, str(ti.run_id), continues=continues)
    except runclaim.RunNameInUse as e:
        raise AirflowFailException(f"refused before anything reached Slurm: {e}") from None


def job_task(params: Mapping[str, Any]) -> dict[str, Any]:
    """The job's fields for SlurmSubmitJobOperator (which sets the tag itself)."""
    spec = lifecycle.spec_from_params(params)
    placeholder = JobTag(dag_id="training_run", run_id="preview", task_id="submit")
    job = lifecycle.make_job(spec, placeholder).to_dict()
    job.pop("comment")
    return job


def finish_task(result: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The run's clean end: promote the final checkpoint and write the report. Skipped after an alert
    (then `hand_over` runs instead); a result that is neither fails the task. The finish of a relaunch
    first puts its first healthy step on the incident's record (the report then lists that recovery)."""
    if result.get("outcome") == ALERTED:
        raise AirflowSkipException("the monitor ended on an alert: sdc_incident handles this run now")
    if result.get("outcome") != COMPLETED:
        raise AirflowFailException(f"the monitor's result has no known outcome: {result.get('outcome')!r}")
    store = store_from_env()
    if params.get("incident_id"):  # a relaunch: its first healthy step closes the time to recover
        run = lifecycle.spec_from_params(params).run_name
        recovery.record(store, run, str(params["incident_id"]))
    report = lifecycle.finish(store, result, params)
    orch = report["orchestrator"]
    log.info(
        "run %s finished at step %s; final fingerprint %s; promoted %s; incidents %s",
        report["run"],
        report["final_step"],
        report["final_fingerprint"],
        orch["promoted_steps"],
        orch["incidents"],
    )
    return {
        "run": report["run"],
        "final_step": report["final_step"],
        "final_fingerprint": report["final_fingerprint"],
        **orch,
    }
