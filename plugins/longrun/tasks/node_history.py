"""What sdc_incident tells the node history, called by its tasks after each step (every try: the writes
are idempotent, so a retried task that had done its step before still leaves the event). The one place
where an incident and the node history meet.

after_attribute   `suspected` + the node's standing on the incident record (`node_history`); a repeat
                  offender is marked for replacement. The note never changes which node is drained.
after_drain       `drained` with the reason
after_diagnose    `diagnosed` with the verdict and the probe's evidence; a failure marks for replacement,
                  an unconfirmed verdict does not (the step's result only: a probe inside the
                  suspect's job never reaches the history by itself, step_diagnose weighs it)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from longrun.health import history as h
from longrun.health.diagnose import VERDICTS
from longrun.health.policy import NodePolicy, standing
from longrun.incident import record
from longrun.incident.runner import Incident
from training.records.alert import Alert
from training.records.diagnosis import Diagnosis
from training.records.incident import Attribution, Drain
from training.store.interface import ObjectStore

REPEAT_OFFENDER_RUNBOOK = "runbooks/repeat-offender.md"


def _common(inc: Incident) -> dict[str, Any]:
    return {"run": inc.run, "incident_id": inc.incident_id}


def _suspicion(alert: Mapping[str, Any], verdict: Any) -> dict[str, Any]:
    a = Alert.from_json(alert)
    return {"check": a.check, "step": a.step, "suspect_ranks": list(a.suspect_ranks), "verdict": verdict}


def after_attribute(
    store: ObjectStore, hist: ObjectStore, inc: Incident, out: Mapping[str, Any], policy: NodePolicy
) -> dict[str, Any] | None:
    """`out`: the attribute step's result (an `Attribution`'s JSON)."""
    att = Attribution.from_json(out)
    node = att.node
    if not node or att.ambiguous:
        return None
    h.record(
        hist,
        node,
        h.SUSPECTED,
        inc.incident_id,
        **_common(inc),
        evidence=_suspicion(inc.alert, att.verdict),
    )
    st = standing(node, h.events(hist, node), policy)
    if st.repeat_offender:
        h.record(hist, node, h.REPLACE, inc.incident_id, **_common(inc), reason=st.why)

    def change(r: dict[str, Any]) -> None:
        r["node_history"] = {
            **st.to_json(),
            "weighed": "history is a note on the evidence: the drain follows the alert's node only",
        }
        if st.repeat_offender:
            record.add_runbook(r, REPEAT_OFFENDER_RUNBOOK)

    record.update(store, run=inc.run, incident_id=inc.incident_id, change=change)
    return st.to_json()


def after_drain(hist: ObjectStore, inc: Incident, out: Mapping[str, Any]) -> None:
    """`out`: the drain step's result (a `Drain`'s JSON)."""
    drained = Drain.from_json(out)
    if drained.observe or not drained.node:
        return
    node = drained.node
    # The suspicion, in case attribute could not write it (a no-op when it did).
    h.record(hist, node, h.SUSPECTED, inc.incident_id, **_common(inc), evidence=_suspicion(inc.alert, None))
    h.record(hist, node, h.DRAINED, inc.incident_id, **_common(inc), reason=drained.reason)


def after_diagnose(hist: ObjectStore, inc: Incident, node: str, out: Mapping[str, Any]) -> None:
    """`out`: the diagnose step's result (a `Diagnosis`'s JSON)."""
    diag = Diagnosis.from_json(out)
    verdict = diag.verdict
    if diag.observe or verdict not in VERDICTS:
        return
    h.record(
        hist,
        node,
        h.DIAGNOSED,
        inc.incident_id,
        **_common(inc),
        verdict=verdict,
        reason=diag.reason,
        evidence=h.probe_evidence(diag),
    )
    if verdict == "fail":
        h.record(hist, node, h.REPLACE, inc.incident_id, **_common(inc), reason="a diagnostic failed")
