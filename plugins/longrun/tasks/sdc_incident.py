"""sdc_incident's @task bodies: build the Incident from the store (the DAG run's params are claims checked
against it: longrun.incident.origin), call its step, log the record.

An IncidentStop becomes AirflowFailException (no retry: a person must look) after the record says why, an
IncidentSkip (a step a person rejected leaves the next one nothing to do) AirflowSkipException;
every task logs the incident summary with its runbook links, so the Airflow log tells the story.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow.sdk import Variable, get_current_context
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from longrun.health import history
from longrun.health.ratelimit import DRAIN_POLICY_VARIABLE, DrainPolicy
from longrun.hooks.slurm import SlurmHook
from longrun.incident import (
    alert_identity,
    approval,
    drill_state,
    exclusive,
    hot_spare,
    modes,
    origin,
    record,
)
from longrun.incident.runner import Incident, IncidentSkip, IncidentStop, authenticate
from longrun.incident.step_diagnose import run_diagnosis
from longrun.incident.step_drain import drain, restore_drain
from longrun.incident.step_relaunch import relaunch
from longrun.incident.steps import attribute, freeze, gate_left, open_record, pick
from longrun.monitor import launches, lifecycle
from longrun.run_identity import RunIdentityError, identities_from_env
from longrun.slurm.errors import JobNotFoundError
from longrun.tasks import node_history
from longrun.tasks.node_return import node_policy
from longrun.ui.plots import render_incident_plots
from training.records.incident import Attribution
from training.store.factory import store_from_env
from training.store.interface import ObjectStore, StoreError

log = logging.getLogger("longrun.sdc_incident")

INCIDENT_PARAMS = lifecycle.INCIDENT_PARAMS
TURN_WAIT_S = 1800.0  # another incident of the run acting (its relaunch, diagnosis) takes minutes
TURN_POLL_S = 10.0


def incident_from(params: Mapping[str, Any], dag_run_id: str, store: ObjectStore) -> Incident:
    """The Incident every task acts on, read from the store (longrun.incident.origin): the conf is only a
    claim, checked against it; a conf that disagrees fails the task, not retried, nothing acted on."""
    try:  # closed conf: no undeclared key here, none in run_params (they would reach the relaunch)
        lifecycle.check_declared(params, INCIDENT_PARAMS)
        lifecycle.check_declared(params.get("run_params") or {})
    except lifecycle.UndeclaredParamError as e:
        raise AirflowFailException(f"refused, nothing acted on: {e}") from None
    try:
        inc = origin.incident_of(store, params, dag_run_id)
    except origin.ConfRefused as e:
        log.error("%s", e)
        raise AirflowFailException(f"refused, nothing acted on: {e}") from None
    try:  # act and approve only where the job cannot write the orchestrator's records
        modes.require_boundary(inc.plan, store)
    except modes.UnsafeModeError as e:
        log.error("%s", e)
        raise AirflowFailException(f"refused, nothing acted on: {e}") from None
    return inc


def _run(params: Mapping[str, Any], dag_run_id: str, body: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    store = store_from_env()
    inc = incident_from(params, dag_run_id, store)
    try:
        out = body(store, inc)
    except IncidentStop as e:
        _log_summary(store, inc)
        raise AirflowFailException(str(e)) from None
    except IncidentSkip as e:
        _log_summary(store, inc)
        raise AirflowSkipException(str(e)) from None
    _log_summary(store, inc)
    return out


def _log_summary(store: ObjectStore, inc: Incident) -> None:
    try:
        log.info("%s", record.summary(inc.rec(store)))
    except Exception as e:  # the summary is for people; never fail a step on it
        log.warning("no incident summary: %s", e)


def open_task(params: Mapping[str, Any], dag_run_id: str) -> dict[str, Any]:
    def body(store: ObjectStore, inc: Incident) -> dict[str, Any]:
        # No incident is opened for an alert that does not check out: a security event instead.
        verdict = authenticate(store, SlurmHook().client, inc)
        join_known_alert(store, inc)
        take_turn(store, inc)
        return open_record(store, inc, allocation=verdict.allocation)

    return _run(params, dag_run_id, body)


def join_known_alert(store: ObjectStore, inc: Incident) -> None:
    """One alert, one incident (longrun.incident.alert_identity): an alert another incident claimed first
    (the same verdict under another key) joins that incident and acts on nothing."""
    held = alert_identity.claim(
        store, run=inc.run, alert=inc.alert, incident_id=inc.incident_id, alert_key=inc.alert_key
    )
    if held.incident_id == inc.incident_id:
        return
    exclusive.join_incident(
        store, run=inc.run, holder_id=held.incident_id, incident_id=inc.incident_id, alert_key=inc.alert_key
    )
    raise AirflowSkipException(
        f"alert {inc.alert_key} says what alert {held.alert_key} said (same run, job, step, check and"
        f" suspects): it joins incident {held.incident_id}; nothing is frozen, drained, relaunched or"
        " counted again"
    )


def take_turn(store: ObjectStore, inc: Incident) -> None:
    """One incident per run acts at a time (longrun.incident.exclusive): act, join, or wait (bounded)."""
    deadline = time.monotonic() + TURN_WAIT_S
    while True:
        turn = exclusive.enter(store, run=inc.run, incident_id=inc.incident_id, job_id=inc.job_id)
        if turn.action == "act":
            return
        if turn.action == "join":
            exclusive.join(store, turn.holder, incident_id=inc.incident_id, alert_key=inc.alert_key)
            raise AirflowSkipException(
                f"alert {inc.alert_key} joins incident {turn.holder.incident_id}, which acts on the same job"
                f" {inc.job_id}: nothing is frozen, drained or relaunched twice (its record lists this alert)"
            )
        if time.monotonic() > deadline:
            if turn.why:
                raise IncidentStop(f"this alert (job {inc.job_id}) waited and did nothing: {turn.why}")
            raise IncidentStop(
                f"incident {turn.holder.incident_id} of run {inc.run} (job {turn.holder.job_id}) still acts"
                f" after {TURN_WAIT_S:.0f} s; this alert (job {inc.job_id}) waited and did nothing."
                " Runbook: runbooks/relaunch-failed.md"
            )
        log.info("incident %s of run %s acts now; waiting for it", turn.holder.incident_id, inc.run)
        time.sleep(TURN_POLL_S)


def freeze_task(params: Mapping[str, Any], dag_run_id: str) -> dict[str, Any]:
    def body(store: ObjectStore, inc: Incident) -> dict[str, Any]:
        out = freeze(store, SlurmHook().client, inc)
        # Here, beside the attribution and the drain, rather than in the pick behind them: validating a
        # checkpoint (torch, a download, a load) takes seconds that the relaunch would otherwise wait for.
        gate_left(store, inc)
        return out

    return _run(params, dag_run_id, body)


def attribute_task(params: Mapping[str, Any], dag_run_id: str) -> dict[str, Any]:
    policy = node_policy()

    def body(store: ObjectStore, inc: Incident) -> dict[str, Any]:
        out = attribute(store, inc)
        try:
            hist = node_history.after_attribute(store, history.history_store(), inc, out, policy)
        except (StoreError, ValueError) as e:
            # The drain must not wait on a note (nor spend this task's retries on one): the drain task
            # records the suspicion again (idempotent); only the note on the record is missing.
            log.warning("node history not updated for %s: %s", Attribution.from_json(out).node, e)
            hist = None
        return {**out, "node_history": hist} if hist else out

    return _run(params, dag_run_id, body)


def drain_policy() -> DrainPolicy:
    raw = Variable.get(DRAIN_POLICY_VARIABLE, default=None, deserialize_json=True)
    if not raw:
        return DrainPolicy()
    if not isinstance(raw, dict):
        raise AirflowFailException(f"Variable {DRAIN_POLICY_VARIABLE}={raw!r}: expected a JSON object")
    try:
        return DrainPolicy(**raw)
    except (TypeError, ValueError) as e:
        raise AirflowFailException(f"Variable {DRAIN_POLICY_VARIABLE}: {e}") from None


def override_decision(approved: bool) -> approval.OverrideDecision:
    """In approve mode: may this drain exceed the rate limit? Read from Airflow only (who responded to
    `approve_drain`, who triggered the run, the operators' Variable), never from the conf."""
    if not approved:
        return approval.OverrideDecision(allowed=False, why="not approve mode: the rate limit holds")
    ctx = get_current_context()
    response = ctx["ti"].xcom_pull(task_ids="approve_drain")
    triggered_by = getattr(ctx["dag_run"], "triggering_user_name", None)
    approvers = Variable.get(approval.APPROVERS_VARIABLE, default=[], deserialize_json=True)
    decision = approval.decide(
        response=response,
        triggered_by=triggered_by,
        approvers=approvers if isinstance(approvers, list) else [],
    )
    log.info("drain override: %s", decision.why)
    return decision


def drain_task(params: Mapping[str, Any], dag_run_id: str, node: str, approved: bool) -> dict[str, Any]:
    policy = drain_policy()
    override = override_decision(approved).allowed

    def body(store: ObjectStore, inc: Incident) -> dict[str, Any]:
        out = drain(store, SlurmHook().client, inc, node=node, policy=policy, operator_override=override)
        node_history.after_drain(history.history_store(), inc, out)
        return out

    return _run(params, dag_run_id, body)


def diagnose_task(params: Mapping[str, Any], dag_run_id: str, node: str) -> dict[str, Any]:
    """The probe inside the kept job first when it can (longrun.incident.hot_spare: evidence only, the job
    could shape it), then the diagnosis in isolation through a MAINT reservation (step_diagnose, which
    weighs that evidence); its verdict goes into the node's history. The in-job path returns a diagnosis
    of its own only when the node cannot leave the job: `unconfirmed`, which marks nothing."""
    store = store_from_env()
    inc = incident_from(params, dag_run_id, store)
    spec = lifecycle.spec_from_params(inc.run_params)
    try:
        out = hot_spare.diagnose_in_job(
            store,
            SlurmHook().client,
            inc,
            node=node,
            partition=spec.partition,
            state_dir=drill_state.for_diagnosis(store, run=inc.run, node=node, job_id=inc.job_id),
        )
    except IncidentStop as e:
        raise AirflowFailException(str(e)) from None
    if out is None:
        return _diagnose_reserved(params, dag_run_id, node)
    node_history.after_diagnose(history.history_store(), inc, node, out)
    return out


def _diagnose_reserved(params: Mapping[str, Any], dag_run_id: str, node: str) -> dict[str, Any]:
    def body(store: ObjectStore, inc: Incident) -> dict[str, Any]:
        spec = lifecycle.spec_from_params(inc.run_params)
        run_nodes = inc.typed_alert.evidence_nodes
        out = run_diagnosis(
            store,
            SlurmHook().client,
            inc,
            node=node,
            run_nodes=run_nodes,
            # the run's fault state only in an operator's sick-node drill on this node (drill_state)
            state_dir=drill_state.for_diagnosis(store, run=inc.run, node=node, job_id=inc.job_id),
            partition=spec.partition,
        )
        node_history.after_diagnose(history.history_store(), inc, node, out)
        return out

    return _run(params, dag_run_id, body)


def pick_task(params: Mapping[str, Any], dag_run_id: str) -> dict[str, Any]:
    return _run(params, dag_run_id, lambda store, inc: pick(store, inc))


def relaunch_task(
    params: Mapping[str, Any], dag_run_id: str, node: str | None, checkpoint: Mapping[str, Any]
) -> dict[str, Any]:
    def body(store: ObjectStore, inc: Incident) -> dict[str, Any]:
        out = relaunch(
            store, SlurmHook().client, inc, node=node, checkpoint=checkpoint, make_job=lifecycle.make_job
        )
        result = {**out, "incident_id": inc.incident_id}
        if not result.get("observe"):  # the record training_run's preflight believes, before the trigger
            launches.record_relaunch(store, result)
        return result

    return _run(params, dag_run_id, body)


def summary_task(params: Mapping[str, Any], dag_run_id: str) -> dict[str, Any]:
    store = store_from_env()
    inc = incident_from(params, dag_run_id, store)
    if holder := exclusive.joined_to(store, run=inc.run, incident_id=inc.incident_id):
        log.info("alert %s joined incident %s; that incident's record tells the story", inc.alert_key, holder)
        return {"incident_id": inc.incident_id, "joined": holder}
    try:
        return _summary(store, inc)
    finally:  # whatever happened: the next incident of this run may act
        exclusive.release(store, run=inc.run, incident_id=inc.incident_id)


def _summary(store: ObjectStore, inc: Incident) -> dict[str, Any]:
    try:  # the diagnose task is over, whatever its outcome: nothing it left may return the node, nor a
        # controller that forgot it (restore_durably)
        restored = restore_drain(store, SlurmHook().client, inc, durably=True)
        if restored["removed_reservations"] or restored["redrained"]:
            log.warning("restored what a dead task left: %s", restored)
    except IncidentStop as e:
        log.error("%s", e)  # the record says so and links the runbook; the status check below fails the run
    final = inc.rec(store)  # validated as it is read
    log.info("%s", record.summary(final))
    try:
        keys = render_incident_plots(store, final.run, final.incident_id)
        log.info("incident plots (also on the run-health page): %s", ", ".join(keys))
    except Exception as e:  # the plots illustrate the record; they must never fail the incident
        log.warning("incident plots not rendered: %s", e)
    status = None if final.status is None else str(final.status)  # the text on the record
    if status != record.RELAUNCHED:
        end_run_identity(inc)
    if status not in (record.RELAUNCHED, record.OBSERVED):
        # The DAG run must fail when the incident did not end in a relaunch (or an observation):
        # ambiguous evidence, a refused drain, a failed relaunch, a rejected approval.
        raise AirflowFailException(
            f"incident {final.incident_id} ended {status!r}, not relaunched; runbooks: {list(final.runbooks)}"
        )
    return {
        "incident_id": final.incident_id,
        "status": status,
        "node": final.attribution.node,
        "diagnosis": final.diagnosis.verdict,
        "checkpoint_step": final.checkpoint.step,
        "lost_steps": final.lost_steps,
        "time_to_recover_s": final.time_to_recover_s,
        "runbooks": list(final.runbooks),
    }


def end_run_identity(inc: Incident) -> None:
    """An incident that did not relaunch ends its run: no job of the run follows, so once the alerting job
    is no longer active the run's store identity goes (longrun.run_identity). A job still running (observe
    mode leaves it be; nothing watches it any more) keeps its identity, with a warning: cutting off a job
    mid-upload is not this task's call (docs/security.md, item 1). A store that cannot remove it fails this
    try (the summary is retried)."""
    if inc.job_id is not None:
        try:
            state = SlurmHook().client.job(inc.job_id)
        except JobNotFoundError:
            state = None
        if state is not None and state.is_active:
            log.warning(
                "run %s: job %s still runs (%s), so its store identity stays",
                inc.run,
                inc.job_id,
                state.describe(),
            )
            return
    try:
        if identities_from_env().revoke(inc.run):
            log.info("run %s ended with incident %s: its store identity is removed", inc.run, inc.incident_id)
    except RunIdentityError as e:
        raise RuntimeError(f"run {inc.run} ended but its store identity is still there: {e}") from e
