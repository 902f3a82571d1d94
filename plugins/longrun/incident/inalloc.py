"""The hot-spare path's diagnosis: the probe runs as a step of the job that still holds the suspect node.

When `sdc_incident` keeps the alerting job (longrun.incident.injob: act mode, spares, job RUNNING) the
suspect node is still in the job's allocation, drained (no other job can land on it) and idle (its
training step ended with the verdict; the directive leaves it out). So, instead of a MAINT reservation:

1. the probe's reference: the partition's cached known-good result, else the probe run as a step on a
   healthy node of the same allocation (`--overlap`: the relaunched training may run there; the probe
   pins its own threads, so its bits do not depend on that load);
2. node_check (the replay probe, + DCGM where installed) as a step on the suspect:
   `srun --jobid=<job> --nodelist=<node>`;
3. the node is drained again with the verdict, recorded as the reservation path records it (events
   `reference` and `diagnosed`, fields `reference` and `diagnosis`, the verdict's runbook);
4. the node is released from the job (`scontrol update JobId=<id> NodeList=<rest>`) and stays drained.

The relaunch (injob.direct) leaves the node in the allocation while this runs: releasing a node kills
the steps on it (Slurm 22.05: the probe step ends with 137).

Anything else falls back to the reservation path (`steps.run_diagnosis`), after an event
`diagnosis_in_job_skipped` that says why: the job is not kept, the node is not (or no longer) in its
allocation, it is not drained by longrun, or the step gave no verdict. Before falling back, the node is
released from a job that still holds it (else the reservation's diagnostic job could not start there).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from longrun.incident import dcgm, diagnose, injob, node_check, runbooks
from longrun.incident.events import Event
from longrun.incident.jobstep import batch_host, run_step
from longrun.incident.probe_reference import checked_reference, confirms, judge_fresh, reference_of
from longrun.incident.runner import Outcome, write
from longrun.slurm import validate as v
from longrun.slurm.client import JobState, SlurmClient
from training.records.diagnosis import NodeCheck, ProbeResult
from training.schema import SchemaError

if TYPE_CHECKING:
    from longrun.incident.steps import Incident
    from training.store import ObjectStore

IN_JOB = "in_job"


def why_not(client: SlurmClient, inc: Incident, node: str) -> tuple[JobState | None, str | None]:
    """(the kept job, None) when `node` can be diagnosed inside it; else (None, why not)."""
    if not inc.plan.changes:
        return None, f"mode {inc.mode} changes nothing"
    state = injob.kept_job(client, inc)
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
    if batch_host(client, inc.job_id) == node:
        inc.event(store, Event.RELEASE_REFUSED, node=node, why="it runs the job's batch script (supervisor)")
        return False
    keep = [n for n in state.nodes if n != node]
    try:
        injob.release_node(client, inc.job_id, keep)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
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
    """The probe's known-good result, as a step on the first of `nodes` (healthy nodes of the job)."""
    if not nodes:
        raise RuntimeError("no healthy node in the allocation for the probe's reference")
    node = nodes[0]
    argv: tuple[str, ...] = (python or sys.executable, "-m", "training.probe", "--node", node)
    if state_dir:
        argv += ("--state-dir", v.path("state_dir", state_dir))
    result = run_step(client, job_id, node, argv, timeout_s=timeout_s, overlap=True)
    obj = node_check.last_json_line(result.stdout)
    if result.exit_code != 0 or not obj or not obj.get("fingerprint"):
        raise RuntimeError(
            f"the reference probe on {node} (step of job {job_id}) gave no fingerprint (rc"
            f" {result.exit_code}): {result.stdout[-300:]} {result.stderr[-300:]}"
        )
    return obj


def _fresh(
    client: SlurmClient, inc: Incident, node: str, healthy: tuple[str, ...], **probe: Any
) -> dict[str, Any] | str:
    """A reference computed now as a step on a healthy node of the kept job, or why there is none."""
    assert inc.job_id is not None
    probe["timeout_s"] = min(300.0, probe["timeout_s"])
    try:
        ref = reference_in_job(client, job_id=inc.job_id, nodes=healthy, **probe)
    except RuntimeError as e:
        return str(e)
    return ref if checked_reference(ref, suspect=node) is not None else f"not usable: {str(ref)[:300]}"


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
    """Diagnose `node` inside the kept job; None when the caller must take the reservation path."""
    from longrun.incident import steps

    rec = inc.rec(store)
    if done := rec.diagnosis:
        if done.where == IN_JOB and inc.plan.changes:
            release(store, client, inc, node)  # a try that died between the verdict and the release
        return done.to_json()  # the recorded object (XCom unchanged)
    state, why = why_not(client, inc, node)
    if state is None or inc.job_id is None:
        if inc.plan.changes and injob.kept_job(client, inc) is not None:
            _skip(store, client, inc, node, why or "no job id")
        return None
    steps.authenticate(store, client, inc, node=node)  # act only on a node of the signed alert's job
    t0 = time.time()
    healthy = healthy_in(client, state.nodes, node)
    recorded = reference_of(rec)
    ref = recorded.to_json() if recorded else None
    if ref is None or checked_reference(ref, suspect=node) is None:
        ref = steps.cached_reference(store, partition, suspect=node)
    stored = ref is not None  # read back: it may convict, a pass needs a fresh reference too
    if ref is None:
        got = _fresh(client, inc, node, healthy, python=python, state_dir=state_dir, timeout_s=timeout_s)
        if isinstance(got, str):
            _skip(store, client, inc, node, f"reference: {got}")
            return None
        ref = got
        steps.remember_reference(store, partition, ref)
    known = ProbeResult.from_json(ref)
    inc.event(
        store,
        Event.REFERENCE,
        fields={"reference": ref},
        node=known.node,
        fingerprint=known.fingerprint,
    )
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
    result = run_step(client, inc.job_id, node, argv, timeout_s=timeout_s)
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
    outcome, note = diagnose.checked_verdict(seen, known, stored=stored)
    probe = checked.probe_result
    summary = diagnose.summarize(node, checked) + note
    if stored and checked.verdict == node_check.PASS and confirms(known, probe):
        fresh = _fresh(client, inc, node, healthy, python=python, state_dir=state_dir, timeout_s=timeout_s)
        if isinstance(fresh, str):
            summary += f"; no fresh reference: {fresh}"
        else:
            steps.remember_reference(store, partition, fresh)
            outcome, note = judge_fresh(probe, ProbeResult.from_json(fresh))
            summary += note
    reason = diagnose.verdict_reason(inc.run, inc.step, outcome)
    client.drain(node, reason)  # drained already; the reason now carries the verdict
    book = runbooks.DIAGNOSTIC_PASSED if outcome == node_check.PASS else runbooks.DIAGNOSTIC_FAILED
    d = diagnose.DiagnosisOutcome(
        node=node,
        verdict=outcome,
        reason=reason,
        summary=f"{summary}; in job {inc.job_id}'s allocation (no reservation)",
        runbook=book,
        duration_s=time.monotonic() - started,
        exit_code=result.exit_code,
        details=seen,
    )
    out = {
        **d.to_dict(),
        "reference_node": known.node,
        "dcgm_level": level,
        "total_s": round(time.time() - t0, 3),
        "where": IN_JOB,
        "job_id": inc.job_id,
    }
    # recorded as the reservation path records its verdict (step_diagnose), plus where it ran
    verdict = {"verdict": d.verdict, "reason": d.reason, "where": IN_JOB}
    write(
        store, inc, Outcome(event=Event.DIAGNOSED, data=verdict, fields={"diagnosis": out}, runbook=d.runbook)
    )
    release(store, client, inc, node)
    return out


def diagnose_task(params: Mapping[str, Any], dag_run_id: str, node: str) -> dict[str, Any]:
    """sdc_incident's diagnose task: inside the kept job when it can, else the reservation path
    (longrun.incident.tasks.diagnose_task, unchanged)."""
    from airflow.sdk.exceptions import AirflowFailException

    from longrun.hooks.slurm import SlurmHook
    from longrun.incident import steps, tasks
    from longrun.monitor import lifecycle
    from longrun.nodes import incident_hooks
    from longrun.nodes import tasks as node_tasks
    from training.store import store_from_env

    store = store_from_env()
    inc = tasks.incident_from(params, dag_run_id, store)
    spec = lifecycle.spec_from_params(inc.run_params)
    try:
        out = diagnose_in_job(
            store,
            SlurmHook().client,
            inc,
            node=node,
            partition=spec.partition,
            state_dir=lifecycle.fault_state_dir(spec),
        )
    except steps.IncidentStop as e:
        raise AirflowFailException(str(e)) from None
    if out is None:
        return tasks.diagnose_task(params, dag_run_id, node)
    incident_hooks.after_diagnose(node_tasks.history_store(), inc, node, out)
    return out
