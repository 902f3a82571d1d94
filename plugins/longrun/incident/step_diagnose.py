"""sdc_incident's diagnose step: the replay probe (and DCGM where present) on the drained node.

The probe's reference comes from the record, the partition's cached reference (probe_reference.py) or a
run on a healthy idle node; the diagnostic runs in a MAINT reservation (incident/diagnose.py) whose name
is the same on every try (keep_drained). Run by incident/runner.py; listed in incident/steps.py.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from longrun.incident import dcgm, diagnose, keep_drained, node_check, runbooks
from longrun.incident.events import Event
from longrun.incident.probe_reference import cached_reference, reference_of, remember_reference
from longrun.incident.runner import Incident, IncidentStop, Outcome, Rec, run
from longrun.incident.step_drain import restore_drain
from longrun.slurm.client import SlurmClient
from training.records.diagnosis import NodeCheck, ProbeResult
from training.store import ObjectStore


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

    def done(rec: Rec) -> dict[str, Any] | None:
        # the recorded object as it is (XCom unchanged), once it reads as a diagnosis
        return rec.diagnosis.to_json() if rec.diagnosis else None

    def observe(rec: Rec) -> Outcome:
        return Outcome(
            event=Event.WOULD_DIAGNOSE, data={"node": node}, result={"node": node, "observe": True}
        )

    def act(rec: Rec) -> Outcome:
        t0 = time.time()
        recorded = reference_of(rec)
        ref = recorded.to_json() if recorded else cached_reference(store, partition)
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
        known = ProbeResult.from_json(ref)
        inc.event(
            store,
            Event.REFERENCE,
            fields={"reference": ref},
            node=known.node,
            fingerprint=known.fingerprint,
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
        )
        probe = NodeCheck.from_json(d.details).probe_result
        if d.verdict == node_check.FAIL and probe and known.env != probe.env:
            # Different torch / CPU level / threads: the fingerprints cannot be compared. Not a verdict.
            d = dataclasses.replace(
                d,
                verdict=node_check.ERROR,
                summary=d.summary + f"; reference environment {list(known.env)} differs from "
                f"the node's {list(probe.env)}: not comparable",
            )
        result = {
            **d.to_dict(),
            "reference_node": known.node,
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
