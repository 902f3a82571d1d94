"""Where the reservation path's diagnosis gets the probe's reference, and how a verdict against one that
does not decide alone is confirmed. The order and what may be cached are probe_reference.choose_reference's;
this module supplies this path's ways of computing a reference now:

1. isolated (`isolated_reference`): the probe on a healthy idle node in a MAINT reservation, in a job of
   its own; cached for the partition. The only kind a verdict is final against.
2. the one this incident recorded, 3. the partition's cached one, each only when computed in isolation
   (a garbled, foreign, self-referential or unmarked object is never used),
4. in a job (`_job_steps`): the probe as a step (`srun --jobid --overlap`) on a healthy node of a job this
   incident runs: its relaunch (the job its record names) or the kept job. Never cached.
5. none: IncidentStop, the node stays drained (runbooks/diagnostic-failed.md).

Why 4 (and not a wait for a free node, or a reference computed before the relaunch): a scheduler restart
can end the first try before it has a reference, and by the retry the relaunch holds every healthy node
for as long as the run lasts, so a bounded wait would end in the same stop, and a reference taken before
the relaunch would put the probe on the relaunch's critical path. The step neither delays the relaunch
(it is already running) nor changes its bits (the probe pins its own thread; the training job is not
touched). But the job can reach the step (same user, same node), so against 2 to 4 a pass, and a fail
that rests on the probe, are `unconfirmed` (diagnose.checked_verdict) until `confirm` compares the node's
probe with a fresh isolated reference; when none can be had the verdict stays unconfirmed: the node stays
drained for a person and nothing marks it for replacement.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from longrun.health import diagnose, node_check
from longrun.health.probe_reference import (
    UnusableReference,
    choose_reference,
    judge_fresh,
    reference_of,
    remember_reference,
    trusted_reference,
)
from longrun.incident import keep_drained, runbooks, step_relaunch
from longrun.incident.hot_spare import healthy_in, kept_job, reference_in_job
from longrun.incident.runner import Incident, IncidentStop, Rec
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import SlurmCommandError
from longrun.slurm.models import JobStatus
from training.records.diagnosis import NodeCheck, ProbeResult
from training.records.schema import SchemaError
from training.store.interface import ObjectStore

log = logging.getLogger("longrun.reference_source")

#: How long the diagnosis waits for a node to compute a reference on when none is free: a job of the
#: incident that just ended leaves its nodes COMPLETING, neither running the job nor idle, for a while.
REFERENCE_WAIT_S = 180.0
REFERENCE_POLL_S = 10.0


def _job_steps(
    store: ObjectStore, client: SlurmClient, inc: Incident, node: str, **probe: Any
) -> dict[str, Any] | None:
    """The probe as a step on a healthy node of the incident's running relaunch (or kept job): an in-job
    reference (probe_reference.in_job_mark), which decides nothing alone and is never cached."""
    # the relaunch this incident recorded, never a job found by its public tag (step_relaunch.recorded_job)
    relaunched = step_relaunch.recorded_job(store, client, inc)
    jobs = [relaunched] if relaunched is not None and relaunched.status is JobStatus.RUNNING else []
    tag = step_relaunch.relaunch_tag(inc)
    if (kept := kept_job(client, inc)) is not None:
        jobs.append(kept)
    errors = []
    if not jobs:
        log.info(
            "no running job of incident %s (relaunch tag %s, kept job %s)",
            inc.incident_id,
            tag.prefix(),
            inc.job_id,
        )
    for job in jobs:
        healthy = healthy_in(client, job.nodes, node)
        if not healthy:
            log.info("job %s holds no healthy node besides %s: %s", job.job_id, node, job.nodes)
            continue
        try:
            return reference_in_job(client, job_id=job.job_id, nodes=healthy, **probe)
        except (RuntimeError, SlurmCommandError) as e:  # the job ended meanwhile, srun refused, ...
            errors.append(f"job {job.job_id}: {e}"[:300])
    if errors:
        raise IncidentStop(
            f"the probe's reference in a running job of this incident failed ({'; '.join(errors)}); "
            f"{node} stays drained ({diagnose.sdc_reason(inc.run, inc.step)}). Runbook: "
            f"{runbooks.DIAGNOSTIC_FAILED}"
        )
    return None


def isolated_reference(
    client: SlurmClient,
    inc: Incident,
    *,
    node: str,
    run_nodes: tuple[str, ...],
    python: str | None,
    state_dir: str | None,
) -> dict[str, Any] | None:
    """The probe run now in isolation on a healthy idle node (MAINT reservation, named for the incident);
    None when no node is idle. NoReference when the probe gives no fingerprint."""
    healthy = diagnose.pick_healthy(client.nodes(), exclude=[node], prefer=run_nodes)
    if healthy is None:
        return None
    return diagnose.reference(
        client,
        node=healthy,
        python=python,
        state_dir=state_dir,
        reservation=keep_drained.reservation_name(keep_drained.REF, inc.incident_id, healthy),
    )


def reference_for(
    store: ObjectStore,
    client: SlurmClient,
    inc: Incident,
    rec: Rec,
    *,
    node: str,
    run_nodes: tuple[str, ...],
    partition: str,
    python: str | None,
    state_dir: str | None,
) -> tuple[dict[str, Any], str]:
    """(the reference's probe JSON, where it came from: probe_reference.IDLE_NODE, RECORDED, CACHED or
    RUNNING_JOB); IncidentStop when there is none to be had."""
    deadline = time.monotonic() + REFERENCE_WAIT_S
    while True:
        try:
            found = choose_reference(
                store,
                partition,
                suspect=node,
                recorded=reference_of(rec),
                isolated=lambda: isolated_reference(
                    client, inc, node=node, run_nodes=run_nodes, python=python, state_dir=state_dir
                ),
                in_job=lambda: _job_steps(
                    store, client, inc, node, python=python, state_dir=state_dir, timeout_s=300.0
                ),
            )
        except UnusableReference as e:
            raise IncidentStop(
                f"{e}; {node} stays drained ({diagnose.sdc_reason(inc.run, inc.step)}). Runbook: "
                f"{runbooks.DIAGNOSTIC_FAILED}"
            ) from None
        if found is not None or time.monotonic() >= deadline:
            break
        log.info("no node free for %s's reference yet; trying again in %.0f s", node, REFERENCE_POLL_S)
        time.sleep(REFERENCE_POLL_S)
    if found is None:
        raise IncidentStop(
            f"no healthy idle node to compute the probe's reference on, and no running job of this "
            f"incident holds one, for {REFERENCE_WAIT_S:.0f} s; {node} stays drained ({diagnose.sdc_reason(inc.run, inc.step)}). "
            f"Runbook: {runbooks.DIAGNOSTIC_FAILED}"
        )
    return found


def confirm(
    store: ObjectStore,
    client: SlurmClient,
    inc: Incident,
    d: diagnose.DiagnosisOutcome,
    *,
    compared: ProbeResult,
    partition: str,
    run_nodes: tuple[str, ...],
    python: str | None,
    state_dir: str | None,
) -> tuple[diagnose.DiagnosisOutcome, str | None]:
    """An unconfirmed verdict `d` (a pass or a fail against `compared`, a reference that does not decide
    alone) against a fresh isolated reference: pass if the node's probe matches that one, fail if it
    differs in the same environment; the node is drained again with that verdict. Without a fresh
    isolated reference, or one not comparable, `d` stays unconfirmed, the node drained so. Returns (the
    outcome, the fresh reference's node)."""
    node = d.node
    try:
        fresh = isolated_reference(
            client, inc, node=node, run_nodes=run_nodes, python=python, state_dir=state_dir
        )
    except SlurmCommandError as e:  # the reservation, or the probe on the idle node, failed
        return dataclasses.replace(d, summary=f"{d.summary}; no fresh isolated reference: {e}"[:2000]), None
    if fresh is None or trusted_reference(fresh, suspect=node) is None:
        why = "no healthy idle node" if fresh is None else f"not usable: {str(fresh)[:300]}"
        return dataclasses.replace(d, summary=f"{d.summary}; no fresh isolated reference ({why})"), None
    remember_reference(store, partition, fresh)
    known = ProbeResult.from_json(fresh)
    try:
        probe = NodeCheck.from_json(d.details).probe_result
    except SchemaError:
        return d, known.node
    verdict, note = judge_fresh(probe, known, compared=compared)
    if verdict == node_check.ERROR:
        return dataclasses.replace(d, summary=d.summary + note), known.node
    reason = diagnose.verdict_reason(inc.run, inc.step, verdict)
    client.drain(node, reason)  # drained already (unconfirmed); the reason now carries the verdict
    book = diagnose.verdict_runbook(verdict)
    out = dataclasses.replace(d, verdict=verdict, reason=reason, runbook=book, summary=d.summary + note)
    return out, known.node
