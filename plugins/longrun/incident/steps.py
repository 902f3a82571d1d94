"""The steps of `sdc_incident`, as plain functions over a store and a Slurm client (no Airflow here).

Each step first reads the incident record and does nothing it has done before (the record's timeline is
the memory), so rerunning a task or the whole DAG run never drains twice, never submits twice and never
loses the record. Each returns a small dict for XCom and the task log.

    open        the record, keyed by the alert
    freeze      cancel the job if it still runs (an SDC verdict normally ended it already)
    attribute   one node, or ambiguous -> IncidentStop (drain nothing; the runbook says what to do)
    drain       rate-limited, with longrun's reason, only if not drained by us already
    diagnose    reference probe on a healthy idle node, then node_check on the drained node
    pick        the pre-incident checkpoint (and demote what came after the last known-good step)
    relaunch    the relaunched job: resumed, drill off, the node excluded; waits until it RUNS
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from longrun.incident import (
    attribution,
    dcgm,
    diagnose,
    injob,
    keep_drained,
    modes,
    node_check,
    record,
    runbooks,
)
from longrun.incident.ratelimit import DrainPolicy, DrainRefused, release_drain, reserve_drain
from longrun.runspec import RunSpec
from longrun.slurm import ops
from longrun.slurm.client import JobStatus, SlurmClient
from longrun.slurm.errors import ForeignDrainError, JobNotFoundError, SlurmError
from longrun.slurm.spec import JobSpec, JobTag
from training import schema
from training.store import ObjectStore, PreconditionFailed, StoreError, put_json

log = logging.getLogger("longrun.sdc_incident")


class IncidentStop(Exception):
    """The incident must stop here and a person must look (ambiguous evidence, rate limit, no nodes).
    The message names the runbook."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Incident:
    """Who the incident is about; built once from the DAG run's params."""

    run: str
    """Run name."""
    alert_key: str
    """Store key of the alert record."""
    alert: Mapping[str, Any]
    """The alert record."""
    job_id: int | None
    """The Slurm job that raised it (None if unknown)."""
    run_params: Mapping[str, Any]
    """The training_run params of the attempt that raised it (a RunSpec's params)."""
    dag_run_id: str = "manual"
    """The sdc_incident DAG run (part of the relaunch job's tag)."""
    alert_seen_at: float | None = None
    """When the monitor's trigger saw the alert (epoch s): the sensor latency is this minus the alert's time."""

    def __post_init__(self) -> None:
        schema.check_run_name(self.run)
        schema.validate("alert", self.alert)

    @property
    def incident_id(self) -> str:
        return record.incident_id_for(self.alert_key)

    @property
    def step(self) -> int:
        return int(self.alert["step"])

    @property
    def mode(self) -> str:
        return str(self.run_params.get("incident_mode", modes.ACT))

    @property
    def plan(self) -> modes.ModePlan:
        return modes.plan(self.mode)

    def rec(self, store: ObjectStore) -> dict[str, Any]:
        return record.load(store, run=self.run, incident_id=self.incident_id)

    def event(
        self, store: ObjectStore, name: str, fields: Mapping[str, Any] | None = None, **data: Any
    ) -> dict[str, Any]:
        return record.add_event(
            store, run=self.run, incident_id=self.incident_id, name=name, fields=fields, **data
        )


def authenticate(store: ObjectStore, client: SlurmClient, inc: Incident, *, node: str | None = None) -> Any:
    """The gate in front of every action: the alert is signed with its job's key, is about this run and
    this job, the job is longrun's for the run, and its suspect nodes (and `node`) are in Slurm's
    allocation of the job. Otherwise: a security event, and IncidentStop (nothing acted on)."""
    from longrun import alert_auth, security_events

    verdict = alert_auth.verify_alert(store, client, run=inc.run, job_id=inc.job_id, alert=inc.alert)
    if verdict.ok and node is not None and node not in verdict.allocation:
        verdict = alert_auth.Verdict(False, "node_outside_allocation", {**verdict.details, "node": node})
    if not verdict.ok:
        details = {**verdict.details, "alert_key": inc.alert_key, "dag_run_id": inc.dag_run_id}
        security_events.raise_event(store, run=inc.run, reason=verdict.reason, details=details)
        raise IncidentStop(
            f"alert {inc.alert_key} not acted on ({verdict.reason}): nothing drained, cancelled or rolled"
            f" back. Runbook: {security_events.RUNBOOK}"
        )
    return verdict


def open_record(store: ObjectStore, inc: Incident) -> dict[str, Any]:
    rec = record.open_incident(store, run=inc.run, alert=inc.alert, alert_key=inc.alert_key, mode=inc.mode)
    seen_at = inc.alert_seen_at
    if seen_at is not None and not record.has_event(rec, "alert_seen"):

        def change(r: dict[str, Any]) -> None:
            if not record.has_event(r, "alert_seen"):
                r["timeline"].append({"event": "alert_seen", "time": float(seen_at)})

        rec = record.update(store, run=inc.run, incident_id=inc.incident_id, change=change)
    return {"incident_id": rec["incident_id"], "mode": rec["mode"], "status": rec.get("status")}


def freeze(
    store: ObjectStore, client: SlurmClient, inc: Incident, *, grace_s: float = 120.0, timeout_s: float = 60.0
) -> dict[str, Any]:
    """Make sure the job no longer runs (a drained node would keep running it). A job that reached an SDC
    verdict ends by itself (exit 93) once its background checkpoint uploads are done: give it `grace_s`
    before cancelling, so the pre-incident checkpoint is not cut off mid-upload."""
    rec = inc.rec(store)
    if done := record.event(rec, "frozen"):
        return {"job_id": inc.job_id, "already": True, "state": done.get("state")}
    authenticate(store, client, inc)  # cancel only the job the signed alert came from, and only ours
    if inc.job_id is None:
        inc.event(store, "frozen", state="no job id known")
        return {"job_id": None, "state": "no job id known"}
    if (kept := injob.freeze_kept(store, client, inc)) is not None:  # hot spares: the job stays
        return kept
    try:
        state = client.job(inc.job_id)
    except JobNotFoundError:
        inc.event(store, "frozen", state="unknown to Slurm")
        return {"job_id": inc.job_id, "state": "unknown to Slurm"}
    if state.is_active:
        try:
            state = ops.wait_for(client, inc.job_id, lambda s: s.is_terminal, timeout_s=grace_s, poll_s=1.0)
        except SlurmError:
            pass  # still running after the grace period
    if state.is_active:
        if not inc.plan.changes:
            inc.event(store, "would_freeze", state=state.describe())
            return {"job_id": inc.job_id, "state": state.describe(), "observe": True}
        client.cancel(inc.job_id)
        state = ops.wait_for(client, inc.job_id, lambda s: s.is_terminal, timeout_s=timeout_s)
    inc.event(store, "frozen", state=state.describe())
    return {"job_id": inc.job_id, "state": state.describe()}


def attribute(store: ObjectStore, inc: Incident) -> dict[str, Any]:
    att = attribution.attribute(inc.alert)

    def change(rec: dict[str, Any]) -> None:
        rec["attribution"] = att.to_dict()
        record.add_runbook(rec, att.runbook)
        if att.ambiguous:
            rec["status"] = record.AMBIGUOUS
        if not record.has_event(rec, "attributed"):
            rec["timeline"].append(
                {"event": "attributed", "time": time.time(), "verdict": att.verdict, "node": att.node}
            )

    record.update(store, run=inc.run, incident_id=inc.incident_id, change=change)
    if att.ambiguous:
        raise IncidentStop(
            f"AMBIGUOUS evidence, suspect software: {att.reason}. Nothing was drained. Runbook: {att.runbook}"
        )
    return att.to_dict()


def drain(
    store: ObjectStore,
    client: SlurmClient,
    inc: Incident,
    *,
    node: str,
    policy: DrainPolicy | None = None,
    operator_override: bool = False,
) -> dict[str, Any]:
    reason = diagnose.sdc_reason(inc.run, inc.step)
    rec = inc.rec(store)
    if record.has_event(rec, "drained") and rec.get("drain"):
        return {**rec["drain"], "rerun": True}  # done before: touch neither Slurm nor the ledger
    if not inc.plan.changes:
        inc.event(store, "would_drain", node=node, reason=reason)
        return {"node": node, "observe": True, "reason": reason}
    authenticate(store, client, inc, node=node)  # drain only a node of the alerting job's allocation
    _stop_on_foreign_drain(store, client, inc, node)  # before the ledger: someone else's drain uses no slot
    try:
        grant = reserve_drain(
            store,
            incident_id=inc.incident_id,
            node=node,
            run=inc.run,
            policy=policy,
            operator_override=operator_override,
        )
    except DrainRefused as e:
        inc.event(store, "drain_refused", fields={"status": record.FAILED}, why=str(e))
        raise IncidentStop(f"{e}. Runbook: {runbooks.AMBIGUOUS_EVIDENCE}") from None
    try:
        out = diagnose.drain_suspect(client, node=node, reason=reason)
    except ForeignDrainError:  # drained by someone else since the check above
        if not grant.already:  # a grant of an earlier try stands for a drain longrun did
            release_drain(store, incident_id=inc.incident_id, node=node)
        _stop_on_foreign_drain(store, client, inc, node)
        raise
    inc.event(
        store,
        "drained",
        fields={
            "drain": {
                "node": node,
                "reason": out.reason,
                "drained_now": out.drained_now,
                "in_window": grant.in_window,
            }
        },
        node=node,
        reason=out.reason,
        drained_now=out.drained_now,
    )
    return {"node": node, "reason": out.reason, "drained_now": out.drained_now, "rerun": grant.already}


def _stop_on_foreign_drain(store: ObjectStore, client: SlurmClient, inc: Incident, node: str) -> None:
    state = client.node(node)
    if state.drain_flag and not state.is_ours:
        why = (
            f"node {node} is drained by someone else (reason {state.reason!r}): longrun leaves it alone and"
            f" drains nothing. Runbook: {runbooks.FOREIGN_DRAIN}"
        )
        inc.event(store, "foreign_drain", fields={"status": record.FAILED}, node=node, reason=state.reason)
        record.update(
            store,
            run=inc.run,
            incident_id=inc.incident_id,
            change=lambda r: record.add_runbook(r, runbooks.FOREIGN_DRAIN),
        )
        raise IncidentStop(why)


def restore_drain(store: ObjectStore, client: SlurmClient, inc: Incident) -> dict[str, Any]:
    """Drain again what the record says longrun drained and remove the incident's leftover reservations
    (see keep_drained); a node someone else drained meanwhile stops the incident with its runbook."""
    try:
        return keep_drained.restore(store, client, inc).to_dict()
    except keep_drained.ForeignDrain as e:
        inc.event(store, "foreign_drain", fields={"status": record.FAILED}, why=str(e))
        record.update(
            store,
            run=inc.run,
            incident_id=inc.incident_id,
            change=lambda r: record.add_runbook(r, runbooks.FOREIGN_DRAIN),
        )
        raise IncidentStop(str(e)) from None


def run_diagnosis(
    store: ObjectStore,
    client: SlurmClient,
    inc: Incident,
    *,
    node: str,
    run_nodes: tuple[str, ...] = (),
    state_dir: str | None = None,
    python: str | None = None,
    timeout_s: float = 600.0,
    partition: str = "default",
) -> dict[str, Any]:
    if inc.plan.changes:
        restore_drain(store, client, inc)  # a try that died inside the reservation left the node resumed
    rec = inc.rec(store)
    if rec.get("diagnosis"):
        return dict(rec["diagnosis"])
    if not inc.plan.changes:
        inc.event(store, "would_diagnose", node=node)
        return {"node": node, "observe": True}
    t0 = time.time()
    ref = rec.get("reference") or cached_reference(store, partition)
    if ref is None:
        healthy = diagnose.pick_healthy(client.nodes(), exclude=[node], prefer=run_nodes)
        if healthy is None:
            raise IncidentStop(
                f"no healthy idle node to compute the probe's reference on; {node} stays drained"
                f" ({diagnose.sdc_reason(inc.run, inc.step)}). Runbook: {runbooks.DIAGNOSTIC_FAILED}"
            )
        ref = diagnose.reference(
            client,
            node=healthy,
            python=python,
            state_dir=state_dir,
            reservation=keep_drained.reservation_name(keep_drained.REF, inc.incident_id, healthy),
        )
        remember_reference(store, partition, ref)
    inc.event(
        store,
        "reference",
        fields={"reference": ref},
        node=ref.get("node"),
        fingerprint=ref.get("fingerprint"),
    )
    level = dcgm.level_for(check=str(inc.alert["check"]))
    d = diagnose.diagnose(
        client,
        node=node,
        run=inc.run,
        step=inc.step,
        expect=str(ref["fingerprint"]),
        dcgm_level=level,
        timeout_s=timeout_s,
        python=python,
        state_dir=state_dir,
        reservation=keep_drained.reservation_name(keep_drained.DIAG, inc.incident_id, node),
        hold_min=keep_drained.DIAG_HOLD_MIN,
    )
    probe = (d.details.get("probe") or {}).get("result") or {}
    if d.verdict == node_check.FAIL and probe and not reference_matches(ref, probe):
        # Different torch / CPU level / threads: the fingerprints cannot be compared. Not a verdict.
        d = dataclasses.replace(
            d,
            verdict=node_check.ERROR,
            summary=d.summary + f"; reference environment {[ref.get(k) for k in _PROBE_ENV]} differs from "
            f"the node's {[probe.get(k) for k in _PROBE_ENV]}: not comparable",
        )
    result = {
        **d.to_dict(),
        "reference_node": ref.get("node"),
        "dcgm_level": level,
        "total_s": round(time.time() - t0, 3),
    }

    def change(r: dict[str, Any]) -> None:
        r["diagnosis"] = result
        record.add_runbook(r, d.runbook)
        if not record.has_event(r, "diagnosed"):
            r["timeline"].append(
                {"event": "diagnosed", "time": time.time(), "verdict": d.verdict, "reason": d.reason}
            )

    record.update(store, run=inc.run, incident_id=inc.incident_id, change=change)
    return result


# The probe's environment: a reference fingerprint is only valid for the same software and CPU level.
_PROBE_ENV = ("torch", "cpu_capability", "threads")


def _reference_key(partition: str) -> str:
    return f"ops/probe-reference/{partition}.json"


def cached_reference(store: ObjectStore, partition: str) -> dict[str, Any] | None:
    """A known-good probe result from an earlier incident in this partition (nodes of one kind), or None."""
    try:
        ref = json.loads(store.get_bytes(_reference_key(partition)))
    except (StoreError, ValueError):
        return None
    return ref if isinstance(ref, dict) and ref.get("fingerprint") else None


def remember_reference(store: ObjectStore, partition: str, ref: Mapping[str, Any]) -> None:
    try:
        put_json(store, _reference_key(partition), dict(ref), if_none_match=True)
    except PreconditionFailed:
        pass  # one is there already (ours, or a concurrent incident's: equal by construction)


def reference_matches(ref: Mapping[str, Any], probe: Mapping[str, Any]) -> bool:
    """Is `ref` a valid reference for this probe run (same torch, CPU level, threads)?"""
    return all(ref.get(k) == probe.get(k) for k in _PROBE_ENV)


def pick(store: ObjectStore, inc: Incident) -> dict[str, Any]:
    """The checkpoint to resume from; demotes the checkpoints after the last known-good step."""
    from longrun.checkpoints.pick import pick_pre_incident, plan_pick
    from longrun.checkpoints.promote import mark_suspect
    from longrun.monitor.gate import gate_pending

    rec = inc.rec(store)
    if rec.get("checkpoint"):
        return dict(rec["checkpoint"])
    # Checkpoints that were still uploading when the monitor saw the alert (the job is final now). This
    # is the normal checkpoint gate, not an incident action, so observe mode runs it too.
    gate_pending(store, inc.run, before_step=inc.step, log=log, by=f"sdc_incident:{inc.incident_id}")
    plan = plan_pick(store, inc.run, inc.alert)
    if inc.plan.changes:
        step, why = pick_pre_incident(store, inc.run, inc.alert, write=True)
        lkg = [s for s in (plan.get("last_known_good") or {}).values() if isinstance(s, int)]
        if lkg:
            mark_suspect(
                store,
                inc.run,
                min(lkg),
                f"incident {inc.incident_id}: {inc.alert['check']} at step {inc.step}",
                incident_id=inc.incident_id,
            )
    else:
        step, why = plan["step"], plan["why"]
    if step is None:
        why += "; restarting from step 0 (a clean start is always from before the fault)"
    resume_step = int(step or 0)
    chosen = {"step": resume_step, "key": plan.get("key") if step is not None else None, "why": why}
    lost = record.lost_steps(alert_step=inc.step, checkpoint_step=resume_step)
    inc.event(store, "picked", fields={"checkpoint": chosen, "lost_steps": lost}, step=chosen["step"])
    return {**chosen, "lost_steps": lost}


def _conf_of(spec: RunSpec) -> dict[str, Any]:
    from longrun.monitor.lifecycle import conf_of

    return conf_of(spec)


def run_spec(inc: Incident) -> RunSpec:
    """The RunSpec of the attempt that raised the alert (its DAG run's params minus the attach fields)."""
    from longrun.monitor.lifecycle import spec_from_params

    return spec_from_params(inc.run_params)


def relaunch_spec(
    inc: Incident, *, resume_from: str | None, exclude: tuple[str, ...], healthy: int
) -> tuple[RunSpec, str]:
    """The RunSpec of the relaunch: the same world when enough healthy nodes remain, else smaller."""
    base = run_spec(inc)
    if resume_from is None:  # nothing provably clean: start over (drill off, node excluded)
        spec = dataclasses.replace(
            base,
            drill=None,
            resume_from=None,
            exclude=tuple(dict.fromkeys((*base.exclude, *exclude))),
            attempt=base.attempt + 1,
        )
    else:
        spec = base.relaunch(resume_from=resume_from, exclude=exclude)
    note = f"world kept: {spec.nodes} node(s)"
    # a full relaunch holds only the spares that are left (it would pend forever waiting for more)
    spec = dataclasses.replace(spec, spare_nodes=min(spec.spare_nodes, max(0, healthy - spec.nodes)))
    if healthy < spec.nodes:
        if healthy < 1:
            raise IncidentStop(f"no healthy node left to relaunch on. Runbook: {runbooks.RELAUNCH_FAILED}")
        note = f"world SHRUNK from {spec.nodes} to {healthy} node(s): no spare left (results differ in bits)"
        spec = dataclasses.replace(spec, nodes=healthy)
    return spec, note


def relaunch(
    store: ObjectStore,
    client: SlurmClient,
    inc: Incident,
    *,
    node: str | None,
    checkpoint: Mapping[str, Any],
    make_job: Callable[[RunSpec, JobTag], JobSpec],
    running_timeout_s: float = 300.0,
) -> dict[str, Any]:
    rec = inc.rec(store)
    if (rl := rec.get("relaunch")) and record.has_event(rec, "relaunched_running"):
        return dict(rl)
    if inc.plan.changes:  # hot spares: recover inside the kept job; else end it for the full relaunch
        if (in_job := injob.direct(store, client, inc, node=node, checkpoint=checkpoint)) is not None:
            return in_job
        injob.end_kept(store, client, inc)
    exclude = (node,) if node else ()
    free = [
        n
        for n in client.nodes()
        if not n.drain_flag
        and not n.is_down
        and n.name not in exclude
        and n.name not in run_spec(inc).exclude
    ]
    spec, note = relaunch_spec(inc, resume_from=checkpoint.get("key"), exclude=exclude, healthy=len(free))
    if not inc.plan.changes:
        inc.event(
            store, "would_relaunch", fields={"status": record.OBSERVED}, params=_conf_of(spec), note=note
        )
        return {"observe": True, "params": _conf_of(spec), "note": note}
    authenticate(store, client, inc)  # roll back only on an authentic alert
    tag = JobTag(dag_id="sdc_incident", run_id=inc.dag_run_id, task_id="relaunch")
    job_id = next((s.job_id for s in client.find_jobs(tag.prefix())), None)
    if job_id is None:
        from longrun import alert_auth

        secrets = alert_auth.submit_env(store, run=spec.run_name, tag=tag.render(), env=os.environ)
        job_id = client.submit(make_job(spec, tag), secret_env=secrets)
        alert_auth.bind(store, run=spec.run_name, tag=tag.render(), job_id=job_id)
        inc.event(store, "relaunch_submitted", job_id=job_id, exclude=list(spec.exclude), note=note)
    state = ops.wait_for(
        client, job_id, lambda s: s.status is JobStatus.RUNNING or s.is_terminal, timeout_s=running_timeout_s
    )
    if state.status is not JobStatus.RUNNING and state.status is not JobStatus.COMPLETED:
        inc.event(store, "relaunch_failed", fields={"status": record.FAILED}, state=state.describe())
        raise IncidentStop(f"relaunched job {state.describe()}. Runbook: {runbooks.RELAUNCH_FAILED}")
    now = time.time()
    alert_time = float(inc.alert.get("time") or now)
    result = {
        "job_id": job_id,
        "nodes": list(state.nodes),
        "exclude": list(spec.exclude),
        "resume_from": spec.resume_from,
        "attempt": spec.attempt,
        "note": note,
        "params": _conf_of(spec),
    }
    inc.event(
        store,
        "relaunched_running",
        fields={
            "relaunch": result,
            "time_to_recover_s": round(now - alert_time, 3),
            "status": record.RELAUNCHED,
        },
        job_id=job_id,
        nodes=list(state.nodes),
    )
    return result
