"""sdc_incident's hot-spare path: recover inside the job's allocation instead of cancel + resubmit.

Applies when the run holds spares (`spare_nodes > 0`), the mode is act, and the alerting job is still
RUNNING (its supervisor waits for a directive; training.spares.supervisor). Then:

- freeze does not cancel the job (`freeze_kept`): the training step already ended with the verdict;
- the suspect stays in the allocation, drained (no other job can land on it) and idle (its training step
  ended with the verdict; the directive leaves it out). It is probed there first (`diagnose_in_job`):
  1. the probe's reference: one this incident recorded or the partition's cached one, when computed in
     isolation, else the probe run as a step on a healthy node of the same allocation (`--overlap`: the
     relaunched training may run there; the probe pins its own threads, so its bits do not depend on
     that load); such an in-job reference is never cached (probe_reference.choose_reference);
  2. node_check (the replay probe, + DCGM where installed) as a step on the suspect:
     `srun --jobid=<job> --nodelist=<node>`;
  3. what it says is recorded as evidence only (event `diagnosed_in_job`: verdict, reference, output):
     the step runs as the job's user inside the job's allocation, where the job can interfere with it;
  4. the node is released from the job (`release`: `scontrol update JobId=<id> NodeList=<rest>`) and
     stays drained, so that the caller diagnoses it in isolation on the reservation path
     (step_diagnose.run_diagnosis, which weighs the evidence): only that verdict reaches the record's
     `diagnosis` and the node's history. A node that cannot leave the job (it hosts the batch script,
     or Slurm refuses the shrink) cannot be probed outside it while the job runs: its diagnosis is
     recorded `unconfirmed` (where `in_job`), the node drained so, for a person. Releasing it before
     the in-job probe would kill the probe's step (Slurm 22.05: it ends with 137), so the relaunch leaves
     it in the allocation until then;
- relaunch (`direct`) writes the directive on the orchestrator's side of the store (the job may read it,
  never write it), naming the job's nodes but the suspect (and any other drained node), once the alerting
  attempt's step has ended (bounded: `earlier_steps`), and waits, bounded, for the supervisor to start
  the attempt (its segment record appears);
- anything else returns None and the caller takes the path without spares: the diagnosis goes to the
  reservation path (step_diagnose.run_diagnosis) without in-job evidence, after an event
  `diagnosis_in_job_skipped` that says why (the job is not kept, the node is not (or no longer) in its
  allocation, it is not drained by longrun, no reference, or the step gave no verdict), the node released
  first from a job that still holds it (else the reservation's diagnostic job could not start there);
  the relaunch (no spare left, no checkpoint, the job already gone, the alerting step not ending, the
  supervisor not following in time) cancels the kept job (`end_kept`) and does the full relaunch.

Approve and observe modes never take this path: they behave as without spares. One module, because the
diagnosis and the relaunch inside the job hand the suspect to each other (whichever runs second releases
it). The task body that chooses between the two diagnosis paths is longrun.tasks.sdc_incident.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

from longrun import alert_auth
from longrun.health import dcgm, diagnose, node_check
from longrun.health.probe_reference import (
    NoReference,
    UnusableReference,
    choose_reference,
    in_job_mark,
    reference_of,
    run_reference,
)
from longrun.incident import record
from longrun.incident.events import Event
from longrun.incident.relaunch_plan import relaunch_spec, run_spec
from longrun.incident.runner import Incident, Outcome, authenticate, write
from longrun.monitor.lifecycle import conf_of
from longrun.monitor.segments import job_step, segments
from longrun.slurm import ops
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import JobNotFoundError, SlurmCommandError, SlurmUnavailableError
from longrun.slurm.models import JobState, JobStatus
from training.records import schema
from training.records.diagnosis import NodeCheck, ProbeResult
from training.records.incident import RestartCheckpoint
from training.records.schema import SchemaError
from training.segment import Segment
from training.spares.directive import DIRECTIVES_DIR, Directive, attempt_of_step_name, directed_nodes
from training.store.interface import ObjectStore
from training.store.update import create_or_read

#: How long relaunch waits for the supervisor to start the directed attempt (it polls every 0.5 s).
FOLLOW_TIMEOUT_S = 120.0
#: How long relaunch waits for the alerting attempt's step to end before it writes the directive.
EARLIER_STEP_TIMEOUT_S = 60.0
#: The diagnosis's `where` when it ran inside the kept job.
IN_JOB = "in_job"


def _keepable_id(inc: Incident) -> int | None:
    """The alerting job's id when this incident keeps that job for a hot spare at all (act mode, a spare);
    None otherwise."""
    keeps = inc.job_id is not None and inc.mode == "act" and run_spec(inc).spare_nodes >= 1
    return inc.job_id if keeps else None


def kept_job(client: SlurmClient, inc: Incident) -> JobState | None:
    """The alerting job, when this incident recovers inside it; None otherwise."""
    if (job_id := _keepable_id(inc)) is None:
        return None
    state = client.job(job_id)
    if alert_auth.job_is_ours(state, inc.run) is not None:
        return None  # the id names another job now (Slurm reuses ids): never keep, shrink or cancel that one
    return state if state.status is JobStatus.RUNNING else None


def freeze_kept(store: ObjectStore, client: SlurmClient, inc: Incident) -> dict[str, Any] | None:
    """In place of freeze's cancel: keep the job (its step ended with the verdict; the supervisor waits)."""
    state = kept_job(client, inc)
    if state is None:
        return None
    inc.event(store, Event.FROZEN, state=f"kept for a hot spare: {state.describe()}", kept=True)
    return {"job_id": inc.job_id, "state": state.describe(), "kept": True}


def release_node(client: SlurmClient, job_id: int, keep: list[str]) -> None:
    """Shrink the running job to `keep` (Slurm 22.05+: the released node leaves the job, its drain stays).
    RuntimeError when Slurm refuses or does not answer (the caller then records why and keeps the node
    drained inside the job); a bad job id or node name raises ValueError before Slurm is asked."""
    try:
        client.shrink_job(job_id, tuple(keep))
    except (SlurmCommandError, SlurmUnavailableError) as err:
        raise RuntimeError(f"releasing nodes from job {job_id} (keeping {keep}) failed: {err}") from err


def _next_attempt(store: ObjectStore, run: str, job_id: int) -> int:
    prefix = schema.store_key(run, f"{DIRECTIVES_DIR}{job_id}-a")
    return 1 + sum(1 for o in store.list(prefix) if o.key.endswith(".json"))


def _write(store: ObjectStore, d: Directive) -> Directive:
    key = schema.store_key(d.run, d.relative_path)
    first = create_or_read(store, key, json.dumps(d.to_json(), sort_keys=True).encode())
    return d if first.created else Directive.from_json(first.data)  # a rerun: the first write stands


def attempt_segment(segs: list[Segment], d: Directive) -> Segment | None:
    """The first segment of the directed attempt: in the job, started after the directive, and of a new job
    step (a late NVRx restart of an earlier step, same step and a higher restart count, is not it)."""
    mine = [s for s in segs if s.job_id == d.job_id]
    earlier = {job_step(s) for s in mine if s.started_at < d.issued_at - 1.0}
    found = [s for s in mine if s.started_at >= d.issued_at - 1.0 and job_step(s) not in earlier]
    return found[0] if found else None


def earlier_steps(client: SlurmClient, job_id: int, attempt: int, *, timeout_s: float) -> list[str]:
    """[] once no training step of an attempt before `attempt` runs in the job (the step names carry the
    attempt: training.spares.directive.ATTEMPT_STEP_PREFIX); else what is left after `timeout_s`. The next
    attempt's standby started at the alert, beside the alerting step: a directive must not let it train
    (and, on GPUs, take the devices) while that step is still ending, and the directed launch's records
    begin at the directive (training.spares.standby)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            left = [
                f"{sid} ({name})"
                for sid, name in client.job_steps(job_id)
                if (a := attempt_of_step_name(name)) is not None and a < attempt
            ]
        except (SlurmCommandError, SlurmUnavailableError, OSError) as e:
            left = [f"unknown: the steps of job {job_id} are unknown: {e}"]  # unproven is not ended
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _followed(store: ObjectStore, client: SlurmClient, d: Directive, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        seg = attempt_segment(segments(store, d.run), d)
        if seg is not None:
            return seg
        state = client.job(int(d.job_id))
        if not state.is_active or time.monotonic() > deadline:
            return None
        time.sleep(0.5)


def direct(
    store: ObjectStore,
    client: SlurmClient,
    inc: Incident,
    *,
    node: str | None,
    checkpoint: Mapping[str, Any],
    follow_timeout_s: float = FOLLOW_TIMEOUT_S,
    earlier_step_timeout_s: float = EARLIER_STEP_TIMEOUT_S,
) -> dict[str, Any] | None:
    """Relaunch inside the kept job; None when this incident must fall back to the full relaunch."""
    state = kept_job(client, inc)
    resume = RestartCheckpoint.from_json(checkpoint).key  # the pick step's result
    if state is None:
        _kept_job_gone(store, client, inc)
        return None
    if inc.job_id is None or not resume or node is None:
        return None
    spec = run_spec(inc)
    held = list(state.nodes)
    # never onto a drained node: an earlier incident's suspect may still be held (its release refused)
    out = {n.name for n in client.nodes() if n.drain_flag or n.is_down}
    keep = directed_nodes(held, {node, *out})
    if len(keep) < spec.nodes:
        inc.event(store, Event.NO_SPARE_LEFT, held=held, node=node)
        return None
    if node in held:
        # verified against the allocation before it changes (a rerun finds the node released already)
        authenticate(store, client, inc, node=node)
        if inc.rec(store).diagnosis:
            release(store, client, inc, node)
        else:  # releasing kills steps on the node: the diagnosis runs there first, then releases it
            inc.event(store, Event.RELEASE_DEFERRED, node=node, why="diagnosed as a step of this job first")
    written = inc.rec(store).event(Event.DIRECTIVE_WRITTEN)
    attempt = int(written.details["attempt"]) if written else _next_attempt(store, inc.run, inc.job_id)
    if not written:
        left = earlier_steps(client, inc.job_id, attempt, timeout_s=earlier_step_timeout_s)
        if left:
            inc.event(store, Event.EARLIER_STEP_RUNNING, steps=left, attempt=attempt)
            return None
    d = _write(
        store,
        Directive(
            run=inc.run,
            job_id=str(inc.job_id),
            attempt=attempt,
            nodes=tuple(keep[: spec.nodes]),
            resume_from=str(resume),
            incident_id=inc.incident_id,
            exclude=(node,),
            issued_at=time.time(),
        ),
    )
    inc.event(store, Event.DIRECTIVE_WRITTEN, attempt=d.attempt, nodes=list(d.nodes), job_id=inc.job_id)
    seg = _followed(store, client, d, follow_timeout_s)
    if seg is None:
        inc.event(store, Event.DIRECTIVE_NOT_FOLLOWED, state=client.job(inc.job_id).describe())
        return None
    return _relaunched_running(store, inc, d, seg, node=node, resume=str(resume), keep=keep, world=spec.nodes)


def _relaunched_running(
    store: ObjectStore,
    inc: Incident,
    d: Directive,
    seg: Segment,
    *,
    node: str,
    resume: str,
    keep: list[str],
    world: int,
) -> dict[str, Any]:
    """Record the directed attempt, started as `seg`, as the full relaunch records a RUNNING job (event
    `relaunched_running`, fields `relaunch` and `time_to_recover_s`, status relaunched); the relaunch result.
    `keep`: the job's nodes the directive could use; `world`: the run's node count."""
    relaunched, _ = relaunch_spec(inc, resume_from=resume, exclude=(node,), healthy=len(keep))
    # the declared params only (closed conf): what reenter_monitoring hands to training_run
    params = conf_of(dataclasses.replace(relaunched, spare_nodes=max(0, len(keep) - world)))
    result = {
        "job_id": inc.job_id,
        "nodes": list(d.nodes),
        "exclude": [node],
        "resume_from": d.resume_from,
        "attempt": params["attempt"],
        "note": f"in-job relaunch on a hot spare (directive {d.relative_path})",
        "params": params,
        "in_job": True,
    }
    started = seg.started_at  # the attempt's trainer was up: the in-job counterpart of RUNNING
    inc.event(
        store,
        Event.RELAUNCHED_RUNNING,
        fields={
            "relaunch": result,
            "time_to_recover_s": round(started - float(inc.typed_alert.time or started), 3),
            "status": record.RELAUNCHED,
        },
        job_id=inc.job_id,
        nodes=list(d.nodes),
        segment=seg.segment_id,
        time=started,
    )
    return result


def _kept_job_gone(store: ObjectStore, client: SlurmClient, inc: Incident) -> None:
    """When freeze kept the job and it no longer runs (it failed on its own, e.g. its supervisor lost the
    store; or Slurm lost it), say so on the timeline: the full relaunch that follows is then explained."""
    if (job_id := _keepable_id(inc)) is None:
        return  # no job was kept: nothing to read (the common full relaunch)
    frozen = inc.rec(store).event(Event.FROZEN)
    if not frozen or not frozen.details.get("kept"):
        return
    try:
        seen = client.job(job_id)
        why = alert_auth.job_is_ours(seen, inc.run)
        state = f"no longer the run's: {why}" if why else seen.describe()
    except JobNotFoundError:
        state = "unknown to Slurm"
    inc.event(store, Event.KEPT_JOB_ENDED, job_id=job_id, state=state)


def end_kept(store: ObjectStore, client: SlurmClient, inc: Incident, *, timeout_s: float = 60.0) -> None:
    """Before a full relaunch: cancel the job freeze kept, if it still runs (no spare, no directive)."""
    frozen = inc.rec(store).event(Event.FROZEN)
    if not frozen or not frozen.details.get("kept") or inc.job_id is None:
        return
    state = client.job(inc.job_id)
    if state.is_active and alert_auth.job_is_ours(state, inc.run) is None:  # never another job given its id
        client.cancel(inc.job_id)
        ops.wait_for(client, inc.job_id, lambda s: s.is_terminal, timeout_s=timeout_s)
        inc.event(store, Event.KEPT_JOB_CANCELLED, job_id=inc.job_id)


def why_not(client: SlurmClient, inc: Incident, node: str) -> tuple[JobState | None, str | None]:
    """(the kept job, None) when `node` can be diagnosed inside it; else (None, why not)."""
    if not inc.plan.changes:
        return None, f"mode {inc.mode} changes nothing"
    state = kept_job(client, inc)
    if state is None:
        return None, "the job is not kept (no spares, not act mode, or it no longer runs)"
    if node not in state.nodes:
        return None, f"{node} is not in job {inc.job_id}'s allocation {list(state.nodes)}"
    ns = client.node(node)
    if not ns.drain_flag or not ns.is_ours:
        return None, f"{node} is not drained by longrun (state {ns.state}, reason {ns.reason!r})"
    return state, None


def release(store: ObjectStore, client: SlurmClient, inc: Incident, node: str) -> bool:
    """Shrink the kept job to its other nodes; the node stays drained. False (and an event saying why)
    when Slurm refuses: the node then stays drained inside the job until the job ends (never trained on:
    the directive leaves it out)."""
    if inc.job_id is None:
        return False
    state = client.job(inc.job_id)
    if not state.is_active or node not in state.nodes:
        return False
    # Releasing the batch host would kill the supervisor and with it the job: release only when Slurm
    # names another node as the batch host. No answer, or none, is no proof, so the node is kept.
    try:
        host = client.batch_host(inc.job_id)
    except (SlurmCommandError, SlurmUnavailableError) as e:
        inc.event(
            store, Event.RELEASE_REFUSED, node=node, why=f"Slurm did not name the batch host: {e}"[:500]
        )
        return False
    if host is None or host == node:
        why = (
            "it runs the job's batch script (supervisor)" if host else "Slurm names no batch host for the job"
        )
        inc.event(store, Event.RELEASE_REFUSED, node=node, why=why)
        return False
    keep = [n for n in state.nodes if n != node]
    try:
        release_node(client, inc.job_id, keep)
    except RuntimeError as e:
        # Slurm 22.05 without accounting shrinks a job once; a second update is refused ("DB index")
        inc.event(store, Event.RELEASE_REFUSED, node=node, why=str(e)[:500])
        return False
    inc.event(store, Event.RELEASED, node=node, job_id=inc.job_id, kept=keep)
    return True


def _skip(store: ObjectStore, client: SlurmClient, inc: Incident, node: str, why: str) -> None:
    inc.event(
        store,
        Event.DIAGNOSIS_IN_JOB_SKIPPED,
        why=why[:500],
        fallback="MAINT reservation (steps.run_diagnosis)",
    )
    if inc.plan.changes:
        release(store, client, inc, node)


def reference_in_job(
    client: SlurmClient,
    *,
    job_id: int,
    nodes: tuple[str, ...],
    python: str | None,
    state_dir: str | None,
    timeout_s: float,
) -> dict[str, Any]:
    """The probe's known-good result, as a step on the first of `nodes` (healthy nodes of the job), marked
    as computed in the job (probe_reference.in_job_mark: never cached, decides nothing alone).
    RuntimeError when there is no such node, NoReference when the probe gives no fingerprint."""
    if not nodes:
        raise RuntimeError("no healthy node in the allocation for the probe's reference")
    node = nodes[0]
    return run_reference(
        lambda argv: client.run_in_job(job_id, node, argv, timeout_s=timeout_s, overlap=True),
        computed=in_job_mark(node, job_id),
        python=python,
        state_dir=state_dir,
    )


def _node_check(seen: dict[str, Any]) -> NodeCheck | None:
    """node_check's JSON line as a NodeCheck; None when it does not read as one (no verdict)."""
    try:
        return NodeCheck.from_json(seen)
    except SchemaError:
        return None


def healthy_in(client: SlurmClient, held: tuple[str, ...], suspect: str) -> tuple[str, ...]:
    """The nodes of `held` other than `suspect` that are neither drained nor down."""
    states = {n.name: n for n in client.nodes()}
    return tuple(
        n for n in held if n != suspect and n in states and not states[n].drain_flag and not states[n].is_down
    )


def diagnose_in_job(
    store: ObjectStore,
    client: SlurmClient,
    inc: Incident,
    *,
    node: str,
    partition: str = "default",
    state_dir: str | None = None,
    python: str | None = None,
    timeout_s: float = 600.0,
) -> dict[str, Any] | None:
    """Probe `node` inside the kept job, as evidence, and release it. Returns the recorded diagnosis when
    there is one (an earlier try's, or `unconfirmed` when the node cannot leave the job); None when the
    caller must diagnose the node on the reservation path: in isolation, weighing this evidence, or
    without it when the probe could not run here (`diagnosis_in_job_skipped` says why).

    Why one function: it is the in-job counterpart of the reservation path's steps, in their order:
    the reference, the node_check step on the suspect, the evidence recorded, the release. Each step uses
    what the ones before it found (the job, the healthy nodes, the reference, the step's output), and
    several end with `_skip`; kept in one place, the order of the Slurm calls and store writes reads top
    to bottom."""
    rec = inc.rec(store)
    if done := rec.diagnosis:
        if done.where == IN_JOB and inc.plan.changes:
            release(store, client, inc, node)  # a try that died between the verdict and the release
        return done.to_json()  # the recorded object (XCom unchanged)
    if rec.event(Event.DIAGNOSED_IN_JOB) is not None and inc.job_id is not None:
        return _out_of_the_job(store, client, inc, node)  # an earlier try probed it here already
    state, why = why_not(client, inc, node)
    if state is None or inc.job_id is None:
        if inc.plan.changes and kept_job(client, inc) is not None:
            _skip(store, client, inc, node, why or "no job id")
        return None
    authenticate(store, client, inc, node=node)  # act only on a node of the signed alert's job
    job_id = inc.job_id
    healthy = healthy_in(client, state.nodes, node)
    try:
        found = choose_reference(
            store,
            partition,
            suspect=node,
            recorded=reference_of(rec),
            in_job=lambda: reference_in_job(
                client,
                job_id=job_id,
                nodes=healthy,
                python=python,
                state_dir=state_dir,
                timeout_s=min(300.0, timeout_s),
            ),
        )
    except (RuntimeError, NoReference, UnusableReference) as e:
        found = None
        why = str(e)
    if found is None:
        _skip(store, client, inc, node, f"reference: {why or 'none to be had'}")
        return None
    ref, source = found
    known = ProbeResult.from_json(ref)
    level = dcgm.level_for(check=inc.typed_alert.check)
    argv = diagnose.node_check_argv(
        node=node,
        expect=str(known.fingerprint),
        dcgm_level=level,
        probe_timeout_s=max(30.0, timeout_s - 30),
        python=python,
        state_dir=state_dir,
    )
    started = time.monotonic()
    result = client.run_in_job(job_id, node, argv, timeout_s=timeout_s)
    seen = node_check.last_json_line(result.stdout)
    checked = None if seen is None else _node_check(seen)
    if (
        seen is None
        or checked is None
        or checked.verdict not in (node_check.PASS, node_check.FAIL, node_check.ERROR)
    ):
        # the step itself did not run (job ended, node left the allocation, srun refused): no verdict
        _skip(
            store,
            client,
            inc,
            node,
            f"the step gave no verdict (rc {result.exit_code}): {result.stderr[-300:]}",
        )
        return None
    said, note = diagnose.checked_verdict(seen, known)
    inc.event(
        store,
        Event.DIAGNOSED_IN_JOB,
        verdict=said,
        node=node,
        job_id=job_id,
        summary=diagnose.summarize(node, checked) + note,
        reference=ref,
        reference_from=source,
        dcgm_level=level,
        duration_s=round(time.monotonic() - started, 3),
        exit_code=result.exit_code,
        details=seen,
    )
    return _out_of_the_job(store, client, inc, node)


def _out_of_the_job(
    store: ObjectStore, client: SlurmClient, inc: Incident, node: str
) -> dict[str, Any] | None:
    """After the probe inside the job: release the node, so that the caller probes it in isolation (None).
    A node that stays in the job (release refused) cannot be probed outside it while the job runs: its
    diagnosis is recorded `unconfirmed`, where `in_job`, and the node drained so (a person decides;
    nothing marks it for replacement). Returns that diagnosis."""
    assert inc.job_id is not None
    release(store, client, inc, node)
    state = client.job(inc.job_id)
    if not state.is_active or node not in state.nodes:
        return None
    ev = inc.rec(store).event(Event.DIAGNOSED_IN_JOB)
    evidence = dict(ev.details) if ev is not None else {}
    said = evidence.get("verdict")
    reason = diagnose.verdict_reason(inc.run, inc.step, diagnose.UNCONFIRMED)
    client.drain(node, reason)  # drained already; the reason now says no verdict was confirmed
    exit_code, took, ref = evidence.get("exit_code"), evidence.get("duration_s"), evidence.get("reference")
    details, level = evidence.get("details"), evidence.get("dcgm_level")
    d = diagnose.DiagnosisOutcome(
        node=node,
        verdict=diagnose.UNCONFIRMED,
        reason=reason,
        summary=(
            f"{evidence.get('summary')}; {node} could not leave job {inc.job_id}, so no probe outside "
            f"the job reached it: the in-job verdict ({said}) stays unconfirmed"
        ),
        runbook=diagnose.verdict_runbook(diagnose.UNCONFIRMED),
        duration_s=float(took) if isinstance(took, int | float) else 0.0,
        exit_code=exit_code if isinstance(exit_code, int) else -1,
        details=dict(details) if isinstance(details, Mapping) else {},
    )
    out = {
        **d.to_dict(),
        "reference_node": ref.get("node") if isinstance(ref, Mapping) else None,
        "in_job_verdict": said,
        "dcgm_level": level if isinstance(level, int) else None,
        "where": IN_JOB,
        "job_id": inc.job_id,
    }
    verdict = {"verdict": d.verdict, "reason": d.reason, "where": IN_JOB}
    write(
        store, inc, Outcome(event=Event.DIAGNOSED, data=verdict, fields={"diagnosis": out}, runbook=d.runbook)
    )
    return out
