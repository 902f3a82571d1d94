"""sdc_incident's diagnose step: the replay probe (and DCGM where present) on the drained node, in
isolation.

The probe's reference comes from a run on a healthy idle node in isolation or, when none is idle, the
record, the partition's cache, or a step of a job of the incident (reference_source.py); the diagnostic
runs in a MAINT reservation (longrun.health.diagnose) whose name is the same on every try
(keep_drained). A pass or fail is final only against a reference computed in isolation by this try; else
it is unconfirmed until a fresh isolated reference confirms it (reference_source.confirm), and stays so
when none can be had. On the hot-spare path this step runs after the probe inside the kept job
(hot_spare.diagnose_in_job), whose verdict is evidence only: it is weighed here (`_weigh_in_job`), never
recorded as the node's verdict by itself. Run by incident/runner.py.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from longrun.health import dcgm, diagnose, node_check
from longrun.health.probe_reference import decides, how_computed
from longrun.incident import keep_drained
from longrun.incident.events import Event
from longrun.incident.reference_source import confirm, reference_for
from longrun.incident.runner import Incident, Outcome, Rec, run
from longrun.incident.step_drain import restore_drain
from longrun.slurm.client import SlurmClient
from training.records.diagnosis import ProbeResult
from training.store.interface import ObjectStore


def _weigh_in_job(
    client: SlurmClient, inc: Incident, rec: Rec, d: diagnose.DiagnosisOutcome
) -> tuple[diagnose.DiagnosisOutcome, str | None]:
    """The isolated verdict `d`, weighed with what the probe inside the suspect's job said before (event
    `diagnosed_in_job`, hot_spare.diagnose_in_job), and that verdict (None: no such probe). The in-job
    one is evidence only: the job could shape it. `d` stands when it agrees, and when it is a fail (found
    in isolation, it needs no agreement); an in-job fail that the isolated probe passed leaves the node
    unconfirmed, drained for a person: the evidence disagrees."""
    ev = rec.event(Event.DIAGNOSED_IN_JOB)
    if ev is None:
        return d, None
    said = str(ev.details.get("verdict"))
    where = f"inside job {ev.details.get('job_id')} the probe said {said}"
    if said == node_check.FAIL and d.verdict == node_check.PASS:
        reason = diagnose.verdict_reason(inc.run, inc.step, diagnose.UNCONFIRMED)
        client.drain(d.node, reason)  # drained already; the reason now says the evidence disagrees
        return dataclasses.replace(
            d,
            verdict=diagnose.UNCONFIRMED,
            reason=reason,
            runbook=diagnose.verdict_runbook(diagnose.UNCONFIRMED),
            summary=f"{d.summary}; {where}: the evidence disagrees, a person decides",
        ), said
    return dataclasses.replace(d, summary=f"{d.summary}; {where}"), said


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
    """The diagnose step (reservation path): the runner (incident/runner.py) calls `done`, then `observe`
    or `act`.

    Why one function: `done`, `observe` and `act` are the runner's callbacks for this one step and close
    over its arguments (the node, the relaunch's nodes, the probe's settings); `act` is long for its own
    reason (below)."""
    if inc.plan.changes:
        restore_drain(store, client, inc)  # a try that died inside the reservation left the node resumed

    def done(rec: Rec) -> dict[str, Any] | None:
        # the recorded object as it is (XCom unchanged), once it reads as a diagnosis
        return rec.diagnosis.to_json() if rec.diagnosis else None

    def observe(rec: Rec) -> Outcome:
        return Outcome(
            event=Event.WOULD_DIAGNOSE, data={"node": node}, result={"node": node, "observe": True}
        )

    def act(rec: Rec) -> Outcome:
        """Act mode: the probe's reference, then the diagnostic in a MAINT reservation on the node.

        Why one function: it is one ordered sequence (the reference and its event, the diagnostic in
        the MAINT reservation, the confirmation of a verdict against a reference that does not decide
        alone, the in-job evidence weighed, the outcome). Most of its length is the keyword arguments
        handed to reference_for, diagnose and confirm, which already hold the logic; each part uses what
        the one before found."""
        t0 = time.time()
        ref, source = reference_for(
            store,
            client,
            inc,
            rec,
            node=node,
            run_nodes=run_nodes,
            partition=partition,
            python=python,
            state_dir=state_dir,
        )
        known = ProbeResult.from_json(ref)
        inc.event(
            store,
            Event.REFERENCE,
            fields={"reference": ref},
            node=known.node,
            fingerprint=known.fingerprint,
            source=source,
            computed=how_computed(ref),
        )
        level = dcgm.level_for(check=inc.typed_alert.check)
        d = diagnose.diagnose(
            client,
            node=node,
            run=inc.run,
            step=inc.step,
            expect=str(known.fingerprint),
            dcgm_level=level,
            timeout_s=timeout_s,
            python=python,
            state_dir=state_dir,
            reservation=keep_drained.reservation_name(keep_drained.DIAG, inc.incident_id, node),
            hold_min=keep_drained.DIAG_HOLD_MIN,
            known=known,  # a pass only on a real match (diagnose.checked_verdict)
            final=decides(source),  # ... and final only against a fresh isolated reference
        )
        checked_on = None
        if d.verdict == diagnose.UNCONFIRMED:
            d, checked_on = confirm(
                store,
                client,
                inc,
                d,
                compared=known,
                partition=partition,
                run_nodes=run_nodes,
                python=python,
                state_dir=state_dir,
            )
        d, in_job = _weigh_in_job(client, inc, rec, d)
        result = {
            **d.to_dict(),
            "reference_node": known.node,
            "confirmed_on": checked_on,
            "reference_from": source,
            "in_job_verdict": in_job,
            "dcgm_level": level,
            "total_s": round(time.time() - t0, 3),
        }
        return Outcome(
            event=Event.DIAGNOSED,
            data={"verdict": d.verdict, "reason": d.reason},
            fields={"diagnosis": result},
            runbook=d.runbook,
            result=result,
        )

    return run(store, inc, done=done, observe=observe, act=act)
