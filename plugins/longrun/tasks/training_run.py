"""training_run's @task bodies: Airflow context in, lifecycle functions called, plain dicts out.

The finish of a relaunch also records its incident's time to recover (longrun.incident.recovery): the run
lifecycle knows nothing of incidents, the task that joins the two does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.sdk import Variable, get_current_context
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from longrun import drill_grant, runclaim, security_events
from longrun.hooks.slurm import SlurmHook
from longrun.incident import recovery
from longrun.monitor import launches, lifecycle
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
    permit = drill_permit(params)
    mode = params.get("incident_mode")
    if mode in MODES_NEEDING_INCIDENTS:
        require_unpaused(
            ti, INCIDENT_DAG, why=f"an SDC alert of this run (incident_mode {mode}) would never be handled"
        )
    out = lifecycle.preflight(store_from_env(), SlurmHook().client, params)
    claim_run_name(params, str(ti.run_id))  # last: a run refused for another reason leaves the name free
    if permit is not None and out["attach_job_id"] is None:
        grant_drill(params, str(ti.run_id), permit)
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


def drill_permit(params: Mapping[str, Any]) -> drill_grant.DrillPermit | None:
    """None for a run without a drill. With one: the permit of the user Airflow recorded as triggering the
    run (`dag_run.triggering_user_name`, never the conf), against the operators' Variable
    (longrun.drill_grant); a refusal fails the task before anything reaches Slurm, naming the Variable."""
    if params.get("drill") is None:
        return None
    user = getattr(get_current_context()["dag_run"], "triggering_user_name", None)
    try:
        operators = drill_grant.DrillOperators.from_setting(
            Variable.get(drill_grant.OPERATORS_VARIABLE, default=None, deserialize_json=True)
        )
    except ValueError as e:  # bad JSON, or not the expected object: nobody may drill until it is fixed
        raise AirflowFailException(f"drill refused before anything reached Slurm: {e}") from None
    permit = drill_grant.permit(user=user, roles=airflow_roles(user), operators=operators)
    if not permit.allowed:
        raise AirflowFailException(f"drill refused before anything reached Slurm: {permit.why}")
    log.warning("drill %s allowed: %s", params.get("drill"), permit.why)
    return permit


def airflow_roles(user: str | None) -> frozenset[str] | None:
    """The Airflow roles of `user`, where a task can learn them: Airflow's simple auth manager keeps its
    users and their roles in Airflow's configuration (`[core] simple_auth_manager_users`), read with its own
    `get_users`. Other auth managers (FAB, Keycloak) keep roles in their database or identity provider,
    which a task cannot reach: None, and only the operators' user names count."""
    if not user:
        return None
    try:
        from airflow.api_fastapi.app import get_auth_manager_cls
        from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
        from airflow.configuration import conf

        if not issubclass(get_auth_manager_cls(), SimpleAuthManager):
            return None
        if conf.getboolean("core", "simple_auth_manager_all_admins", fallback=False):
            return None  # no logins at all: every request is an anonymous admin
        return frozenset(u.role for u in SimpleAuthManager.get_users() if u.username == user and u.role)
    except Exception as e:  # noqa: BLE001 - a worker without Airflow's core: no roles, names only
        log.warning("the Airflow roles of %s are unknown to this task (%s): only user names count", user, e)
        return None


def grant_drill(params: Mapping[str, Any], dag_run_id: str, permit: drill_grant.DrillPermit) -> None:
    """Record that an operator set this launch's drill (longrun.drill_grant), before it reaches Slurm: the
    probes read the run's fault state only while this grant lasts."""
    spec = lifecycle.spec_from_params(params)
    if spec.drill is None:  # not reached: drill_permit gave a permit because the params set one
        return
    drill = {"kind": spec.drill.kind, "step": spec.drill.step, "target": spec.drill.target}
    rec = drill_grant.grant(
        run=spec.run_name,
        dag_run_id=dag_run_id,
        drill=drill,
        by=permit,
        fault_state_dir=lifecycle.fault_state_dir(spec),
    )
    drill_grant.write(store_from_env(), rec)


def claim_run_name(params: Mapping[str, Any], dag_run_id: str) -> None:
    """One run, one name (longrun.runclaim): refused unless the DAG run `dag_run_id` holds the name, or
    continues the run by the orchestrator's own record of that relaunch (longrun.monitor.launches: run,
    attempt, job, DAG run id and params must match it; the conf alone proves nothing, anyone who may
    trigger this DAG writes it). The DAG run that holds the name records its launch."""
    run = str(params["run_name"])
    store = store_from_env()
    attach = params.get("attach_job_id")
    continues = attach is not None and int(params.get("attempt") or 0) >= 1
    if continues:
        try:
            launches.check_continuation(store, params, dag_run_id)
        except launches.NotAContinuation as e:
            details = {"dag_run_id": dag_run_id, "attach_job_id": attach, "attempt": params.get("attempt")}
            security_events.raise_event(store, run=run, reason="unrecorded_continuation", details=details)
            raise AirflowFailException(f"refused before anything reached Slurm: {e}") from None
    try:
        runclaim.claim(store, run, dag_run_id, continues=continues)
        if not continues:
            launches.record_first(store, params, dag_run_id)
    except (runclaim.RunNameInUse, launches.LaunchConflict) as e:
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
