"""sdc_incident's diagnose step: the replay probe (and DCGM where present) on the drained node.

The probe's reference comes from the record, the partition's cached reference, a run on a healthy idle
node or, when the relaunch holds them all, a step of the relaunch (reference_source.py); the diagnostic
runs in a MAINT reservation (longrun.health.diagnose) whose name is the same on every try
(keep_drained). A pass against a stored reference counts only once a fresh reference confirms it
(confirm_pass). Run by incident/runner.py.
"""

from __future__ import annotations

import time
from typing import Any

from longrun.health import dcgm, diagnose, node_check
from longrun.health.probe_reference import confirms
from longrun.incident import keep_drained
from longrun.incident.events import Event
from longrun.incident.reference_source import STORED, confirm_pass, reference_for
from longrun.incident.runner import Incident, Outcome, Rec, run
from longrun.incident.step_drain import restore_drain
from longrun.slurm.client import SlurmClient
from training.records.diagnosis import NodeCheck, ProbeResult
from training.records.schema import SchemaError
from training.store.interface import ObjectStore


def _matched(d: diagnose.DiagnosisOutcome, known: ProbeResult) -> bool:
    """node_check passed against `known` (its verdict was turned into a pending error)."""
    try:
        check = NodeCheck.from_json(d.details)
    except SchemaError:
        return False
    return check.verdict == node_check.PASS and confirms(known, check.probe_result)


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
        the MAINT reservation, the confirmation of a pass against a stored reference, the outcome). Most
        of its length is the keyword arguments handed to reference_for, diagnose and confirm_pass, which
        already hold the logic; each part uses what the one before found."""
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
            stored=source in STORED,  # ... and, against a stored reference, a pending one (error)
        )
        checked_on = None
        if source in STORED and d.verdict == node_check.ERROR and _matched(d, known):
            d, checked_on = confirm_pass(
                store,
                client,
                inc,
                d,
                partition=partition,
                run_nodes=run_nodes,
                python=python,
                state_dir=state_dir,
            )
        result = {
            **d.to_dict(),
            "reference_node": known.node,
            "confirmed_on": checked_on,
            "reference_from": source,
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
