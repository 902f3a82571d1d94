"""sdc_incident's hot-spare path: recover inside the job's allocation instead of cancel + resubmit.

Applies when the run holds spares (`spare_nodes > 0`), the mode is act, and the alerting job is still
RUNNING (its supervisor waits for a directive; training.supervisor). Then:

- freeze does not cancel the job: the training step already ended with the verdict;
- relaunch writes the directive on the orchestrator's side of the store (the job may read it, never
  write it), naming the job's nodes but the suspect (and any other drained node), once the alerting
  attempt's step has ended (bounded: `earlier_steps`), and waits, bounded, for the supervisor to start
  the attempt (its segment record appears);
- the suspect stays in the allocation, drained, until the diagnosis has run there as a job step
  (longrun.incident.inalloc), which then releases it (`scontrol update JobId=<id> NodeList=<rest>`; it
  stays drained with the verdict). Releasing first would kill that step;
- anything else (no spare left, no checkpoint, the job already gone, the alerting step not ending, the
  supervisor not following in time) returns None, and the caller cancels the kept job and does today's
  full relaunch.

Approve and observe modes never take this path: they behave as without spares.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from longrun.incident import record, recovery
from longrun.incident.events import Event
from longrun.incident.jobstep import job_steps
from longrun.slurm import validate as v
from longrun.slurm.client import JobState, JobStatus, SlurmClient
from training import schema
from training.directive import DIRECTIVES_DIR, Directive, attempt_of_step_name, directed_nodes
from training.records.incident import RestartCheckpoint
from training.segment import Segment
from training.store import ObjectStore, PreconditionFailed

if TYPE_CHECKING:
    from longrun.incident.steps import Incident

#: How long relaunch waits for the supervisor to start the directed attempt (it polls every 0.5 s).
FOLLOW_TIMEOUT_S = 120.0
#: How long relaunch waits for the alerting attempt's step to end before it writes the directive.
EARLIER_STEP_TIMEOUT_S = 60.0


def kept_job(client: SlurmClient, inc: Incident) -> JobState | None:
    """The alerting job, when this incident recovers inside it; None otherwise."""
    from longrun.incident.steps import run_spec

    if inc.job_id is None or inc.mode != "act" or run_spec(inc).spare_nodes < 1:
        return None
    state = client.job(inc.job_id)
    return state if state.status is JobStatus.RUNNING else None


def freeze_kept(store: ObjectStore, client: SlurmClient, inc: Incident) -> dict[str, Any] | None:
    """In place of freeze's cancel: keep the job (its step ended with the verdict; the supervisor waits)."""
    state = kept_job(client, inc)
    if state is None:
        return None
    inc.event(store, Event.FROZEN, state=f"kept for a hot spare: {state.describe()}", kept=True)
    return {"job_id": inc.job_id, "state": state.describe(), "kept": True}


def release_node(client: SlurmClient, job_id: int, keep: list[str]) -> None:
    """Shrink the running job to `keep` (Slurm 22.05+: the released node leaves the job, its drain stays)."""
    nodes = v.nodes("keep", tuple(keep))
    env = dict(os.environ)
    if conf := getattr(client, "slurm_conf", None):
        env["SLURM_CONF"] = str(conf)
    argv = ["scontrol", "update", f"JobId={int(job_id)}", f"NodeList={','.join(nodes)}"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {out.stderr.strip() or out.stdout.strip()}")


def _next_attempt(store: ObjectStore, run: str, job_id: int) -> int:
    prefix = schema.store_key(run, f"{DIRECTIVES_DIR}{job_id}-a")
    return 1 + sum(1 for o in store.list(prefix) if o.key.endswith(".json"))


def _write(store: ObjectStore, d: Directive) -> Directive:
    import json

    key = schema.store_key(d.run, d.relative_path)
    try:
        store.put_bytes(key, json.dumps(d.to_json(), sort_keys=True).encode(), if_none_match=True)
        return d
    except PreconditionFailed:  # a rerun: the first write stands
        return Directive.from_json(store.get_bytes(key))


def attempt_segment(segs: list[Segment], d: Directive) -> Segment | None:
    """The first segment of the directed attempt: in the job, started after the directive, and of a new job
    step (a late NVRx restart of an earlier step, same step and a higher restart count, is not it)."""
    mine = [s for s in segs if s.job_id == d.job_id]
    earlier = {recovery.job_step(s) for s in mine if s.started_at < d.issued_at - 1.0}
    found = [s for s in mine if s.started_at >= d.issued_at - 1.0 and recovery.job_step(s) not in earlier]
    return found[0] if found else None


def earlier_steps(client: SlurmClient, job_id: int, attempt: int, *, timeout_s: float) -> list[str]:
    """[] once no training step of an attempt before `attempt` runs in the job (the step names carry the
    attempt: training.directive.ATTEMPT_STEP_PREFIX); else what is left after `timeout_s`. The next
    attempt's standby started at the alert, beside the alerting step: a directive must not let it train
    (and, on GPUs, take the devices) while that step is still ending, and the directed launch's records
    begin at the directive (training.standby)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            left = [
                f"{sid} ({name})"
                for sid, name in job_steps(client, job_id)
                if (a := attempt_of_step_name(name)) is not None and a < attempt
            ]
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            left = [f"unknown: {e}"]  # unproven is not ended
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _followed(store: ObjectStore, client: SlurmClient, d: Directive, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        seg = attempt_segment(recovery.segments(store, d.run), d)
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
    from longrun.incident.steps import authenticate, relaunch_spec, run_spec
    from longrun.monitor.lifecycle import conf_of

    state = kept_job(client, inc)
    resume = RestartCheckpoint.from_json(checkpoint).key  # the pick step's result
    if state is None or inc.job_id is None or not resume or node is None:
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
            from longrun.incident import inalloc

            inalloc.release(store, client, inc, node)
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
    relaunched, _ = relaunch_spec(inc, resume_from=str(resume), exclude=(node,), healthy=len(keep))
    # the declared params only (closed conf): what reenter_monitoring hands to training_run
    params = conf_of(dataclasses.replace(relaunched, spare_nodes=max(0, len(keep) - spec.nodes)))
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


def end_kept(store: ObjectStore, client: SlurmClient, inc: Incident, *, timeout_s: float = 60.0) -> None:
    """Before a full relaunch: cancel the job freeze kept, if it still runs (no spare, no directive)."""
    frozen = inc.rec(store).event(Event.FROZEN)
    if not frozen or not frozen.details.get("kept") or inc.job_id is None:
        return
    if client.job(inc.job_id).is_active:
        client.cancel(inc.job_id)
        from longrun.slurm import ops

        ops.wait_for(client, inc.job_id, lambda s: s.is_terminal, timeout_s=timeout_s)
        inc.event(store, Event.KEPT_JOB_CANCELLED, job_id=inc.job_id)
