"""Where the reservation path's diagnosis gets the probe's reference, in order:

1. the one this incident recorded (an earlier try), 2. the partition's cached one
   (probe_reference.checked_reference: a garbled, foreign or self-referential cached object is never used),
3. a run of the probe on a healthy idle node (MAINT reservation),
4. a run of the probe as a step (`srun --jobid --overlap`) on a healthy node of a job this incident
   runs: its relaunch (found by its tag) or the kept job,
5. none: IncidentStop, the node stays drained (runbooks/diagnostic-failed.md).

Why 4 (and not a wait for a free node, or a reference computed before the relaunch): a scheduler restart
can end the first try before it has a reference, and by the retry the relaunch holds every healthy node
for as long as the run lasts, so a bounded wait would end in the same stop, and a reference taken before
the relaunch would put the probe on the relaunch's critical path. The relaunch's nodes are healthy by
construction (the suspect is excluded), they run the same software, and the step neither delays the
relaunch (it is already running) nor changes its bits (the probe pins its own thread; the training job
is not touched). The hot-spare path already takes its reference this way (incident/hot_spare.py). The
verdict is not weakened: the reference is the same probe command on a healthy node, and a pass still
needs the suspect's fingerprint and environment to match it (probe_reference.confirms).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from longrun.health import diagnose, node_check
from longrun.health.probe_reference import (
    cached_reference,
    checked_reference,
    judge_fresh,
    reference_of,
    remember_reference,
)
from longrun.incident import keep_drained, runbooks
from longrun.incident.hot_spare import healthy_in, kept_job, reference_in_job
from longrun.incident.runner import Incident, IncidentStop, Rec
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import SlurmCommandError
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobTag
from training.records.diagnosis import NodeCheck, ProbeResult
from training.records.schema import SchemaError
from training.store.interface import ObjectStore

#: How the reference was obtained (the record's `diagnosis.reference_from`).
RECORDED, CACHED, IDLE_NODE, RUNNING_JOB = "recorded", "cached", "idle_node", "running_job"
#: Read back from the store (an earlier try's record, the partition's cache), not computed by this try:
#: it may convict, but a pass against it needs a fresh reference too (confirm_pass).
STORED = (RECORDED, CACHED)


def _job_steps(client: SlurmClient, inc: Incident, node: str, **probe: Any) -> dict[str, Any] | None:
    """The probe as a step on a healthy node of the incident's running relaunch (or kept job)."""
    tag = JobTag(dag_id="sdc_incident", run_id=inc.dag_run_id, task_id="relaunch")
    jobs = [s for s in client.find_jobs(tag.prefix()) if s.status is JobStatus.RUNNING]
    if (kept := kept_job(client, inc)) is not None:
        jobs.append(kept)
    errors = []
    for job in jobs:
        healthy = healthy_in(client, job.nodes, node)
        if not healthy:
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


def fresh_reference(
    client: SlurmClient,
    inc: Incident,
    *,
    node: str,
    run_nodes: tuple[str, ...],
    python: str | None,
    state_dir: str | None,
) -> tuple[dict[str, Any], str]:
    """The probe run now on a healthy node: an idle one (MAINT reservation), else a step of a running job
    of this incident; IncidentStop when there is neither (or the run gives no usable reference)."""
    healthy = diagnose.pick_healthy(client.nodes(), exclude=[node], prefer=run_nodes)
    if healthy is not None:
        ref = diagnose.reference(
            client,
            node=healthy,
            python=python,
            state_dir=state_dir,
            reservation=keep_drained.reservation_name(keep_drained.REF, inc.incident_id, healthy),
        )
        src = IDLE_NODE
    else:
        found = _job_steps(client, inc, node, python=python, state_dir=state_dir, timeout_s=300.0)
        if found is None:
            raise IncidentStop(
                f"no healthy idle node to compute the probe's reference on, and no running job of this "
                f"incident holds one; {node} stays drained ({diagnose.sdc_reason(inc.run, inc.step)}). "
                f"Runbook: {runbooks.DIAGNOSTIC_FAILED}"
            )
        ref, src = found, RUNNING_JOB
    if checked_reference(ref, suspect=node) is None:
        raise IncidentStop(
            f"the probe's reference run gave no usable reference ({str(ref)[:300]}); {node} stays drained "
            f"({diagnose.sdc_reason(inc.run, inc.step)}). Runbook: {runbooks.DIAGNOSTIC_FAILED}"
        )
    return ref, src


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
    """(the reference's probe JSON, where it came from: one of STORED, IDLE_NODE, RUNNING_JOB);
    IncidentStop when there is none to be had."""
    recorded = reference_of(rec)
    if recorded is not None and checked_reference(recorded.to_json(), suspect=node) is not None:
        return recorded.to_json(), RECORDED
    if (cached := cached_reference(store, partition, suspect=node)) is not None:
        return cached, CACHED
    ref, src = fresh_reference(
        client, inc, node=node, run_nodes=run_nodes, python=python, state_dir=state_dir
    )
    remember_reference(store, partition, ref)
    return ref, src


def confirm_pass(
    store: ObjectStore,
    client: SlurmClient,
    inc: Incident,
    d: diagnose.DiagnosisOutcome,
    *,
    partition: str,
    run_nodes: tuple[str, ...],
    python: str | None,
    state_dir: str | None,
) -> tuple[diagnose.DiagnosisOutcome, str | None]:
    """A node that matched a stored reference (so `d` is `error`, pending) is compared with a fresh
    reference: pass only if it matches that one too, fail if it differs in the same environment. The node
    is drained again with that verdict. Without a fresh reference `d` stays `error`, the node drained.
    Returns (the outcome, the fresh reference's node)."""
    node = d.node
    try:
        fresh, _ = fresh_reference(
            client, inc, node=node, run_nodes=run_nodes, python=python, state_dir=state_dir
        )
    except IncidentStop as e:
        return dataclasses.replace(d, summary=f"{d.summary}; {e}"), None
    remember_reference(store, partition, fresh)
    known = ProbeResult.from_json(fresh)
    try:
        probe = NodeCheck.from_json(d.details).probe_result
    except SchemaError:
        return d, known.node
    verdict, note = judge_fresh(probe, known)
    if verdict == node_check.ERROR:
        return dataclasses.replace(d, summary=d.summary + note), known.node
    reason = diagnose.verdict_reason(inc.run, inc.step, verdict)
    client.drain(node, reason)  # drained already (error); the reason now carries the verdict
    book = diagnose.verdict_runbook(verdict)
    out = dataclasses.replace(d, verdict=verdict, reason=reason, runbook=book, summary=d.summary + note)
    return out, known.node
