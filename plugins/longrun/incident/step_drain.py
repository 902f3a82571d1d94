"""sdc_incident's drain step, and `restore_drain`, which keeps what longrun drained drained.

The drain is rate-limited (longrun.health.ratelimit), carries longrun's reason, and is done once: a rerun
returns the recorded drain. A node someone else drained is left alone and stops the incident with the
foreign-drain runbook. Run by incident/runner.py.
"""

from __future__ import annotations

from typing import Any

from longrun.health import diagnose
from longrun.health.ratelimit import DrainPolicy, DrainRefused, release_drain, reserve_drain
from longrun.incident import keep_drained, record, runbooks
from longrun.incident.events import Event
from longrun.incident.runner import Incident, Outcome, Rec, authenticate, run, stop
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import ForeignDrainError
from training.store.interface import ObjectStore


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

    def done(rec: Rec) -> dict[str, Any] | None:
        if record.has_event(rec, Event.DRAINED) and rec.drain:
            return {**rec.drain.to_json(), "rerun": True}  # done before: touch neither Slurm nor the ledger
        return None

    def observe(rec: Rec) -> Outcome:
        return Outcome(
            event=Event.WOULD_DRAIN,
            data={"node": node, "reason": reason},
            result={"node": node, "observe": True, "reason": reason},
        )

    def act(rec: Rec) -> Outcome:
        authenticate(store, client, inc, node=node)  # drain only a node of the alerting job's allocation
        # before the ledger: someone else's drain uses no slot
        _stop_on_foreign_drain(store, client, inc, node)
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
            why = str(e)
            return Outcome(
                event=Event.DRAIN_REFUSED,
                data={"why": why},
                status=record.FAILED,
                stop=f"{why}. Runbook: {runbooks.AMBIGUOUS_EVIDENCE}",
            )
        try:
            out = diagnose.drain_suspect(client, node=node, reason=reason)
        except ForeignDrainError:  # drained by someone else since the check above
            if not grant.already:  # a grant of an earlier try stands for a drain longrun did
                release_drain(store, incident_id=inc.incident_id, node=node)
            _stop_on_foreign_drain(store, client, inc, node)
            raise
        drained = {"node": node, "reason": out.reason, "drained_now": out.drained_now}
        return Outcome(
            event=Event.DRAINED,
            data=drained,
            fields={"drain": {**drained, "in_window": grant.in_window}},
            result={**drained, "rerun": grant.already},
        )

    return run(store, inc, done=done, observe=observe, act=act)


def _stop_on_foreign_drain(store: ObjectStore, client: SlurmClient, inc: Incident, node: str) -> None:
    state = client.node(node)
    if state.drain_flag and not state.is_ours:
        stop(
            store,
            inc,
            Outcome(
                event=Event.FOREIGN_DRAIN,
                data={"node": node, "reason": state.reason},
                status=record.FAILED,
                runbook=runbooks.FOREIGN_DRAIN,
                stop=f"node {node} is drained by someone else (reason {state.reason!r}): longrun leaves it"
                f" alone and drains nothing. Runbook: {runbooks.FOREIGN_DRAIN}",
            ),
        )


def restore_drain(
    store: ObjectStore, client: SlurmClient, inc: Incident, *, durably: bool = False
) -> dict[str, Any]:
    """Drain again what the record says longrun drained and remove the incident's leftover reservations
    (see keep_drained; `durably`: and again once slurmctld must have saved it, `restore_durably`); a node
    someone else drained meanwhile stops the incident with its runbook."""
    try:
        restore = keep_drained.restore_durably if durably else keep_drained.restore
        return restore(store, client, inc).to_dict()
    except keep_drained.ForeignDrain as e:
        why = str(e)
    stop(
        store,
        inc,
        Outcome(
            event=Event.FOREIGN_DRAIN,
            data={"why": why},
            status=record.FAILED,
            runbook=runbooks.FOREIGN_DRAIN,
            stop=why,
        ),
    )
