"""A suspect node never returns by accident: whatever died in between, what the incident record says longrun
drained is drained again, and the incident's leftover MAINT reservations are removed.

Why: the diagnosis resumes the drained node inside a MAINT reservation. A task that dies there (worker
killed, OOM, a lost heartbeat) leaves the node resumed; once the reservation ends the suspect node takes
jobs again, and a retry used to refuse the node as "not drained by longrun". So:

- reservation names are deterministic per incident and node (`reservation_name`), so a retry or the next
  step finds what an earlier try left;
- the diagnose task calls `restore` before it starts (its retry is the next try), and the summary task,
  which runs after the diagnose task whatever its outcome, calls it again;
- a node drained by someone else (a reason without longrun's prefix) is left alone and stops the incident
  with the foreign-drain runbook;
- a ledger entry of the incident that does not read (a malformed `time`, say, or one the rate limit has
  quarantined for it) still keeps its node drained, its time unknown; one that names no node is logged and
  passed over.

Only the diagnose task and the summary call `restore`: the pick and the relaunch run beside the diagnosis,
and draining the node between its resume and the diagnostic job's start would stall the diagnostic.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from longrun.health import diagnose, ratelimit
from longrun.health.ratelimit import DrainEntry
from longrun.incident import record, runbooks
from longrun.incident.events import Event
from longrun.incident.runner import Incident
from longrun.slurm import ops
from longrun.slurm import validate as v
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import SlurmCommandError, SlurmUnavailableError
from training.records.diagnosis import Diagnosis
from training.records.incident import Drain
from training.records.schema import SchemaError
from training.store.interface import ObjectStore

DIAG, REF = "diag", "ref"
#: The diagnostic's MAINT reservation outlives any diagnose try by far: if everything dies, the suspect
#: node stays out of service (reserved) until the next task, a rerun or an operator removes it.
DIAG_HOLD_MIN = 24 * 60
#: srun's job name for commands run in a reservation (the CLI backend's `run_in_reservation`).
DIAG_JOB_NAME = "longrun-diag"
CANCEL_WAIT_S = 30.0

log = logging.getLogger("longrun.sdc_incident")


class ForeignDrain(Exception):
    """The node is drained by someone else: longrun leaves it alone. The message names the runbook."""


def _tag(incident_id: str) -> str:
    return hashlib.sha256(incident_id.encode()).hexdigest()[:10]


def reservation_prefix(kind: str, incident_id: str) -> str:
    """Every reservation of `kind` (diag, ref) this incident creates starts with this."""
    if kind not in (DIAG, REF):
        raise ValueError(f"kind={kind!r}: expected {DIAG!r} or {REF!r}")
    return f"longrun_{kind}_{_tag(incident_id)}_"


def reservation_name(kind: str, incident_id: str, node: str) -> str:
    """The reservation of `kind` on `node` for this incident: the same name on every try."""
    return v.name("reservation", (reservation_prefix(kind, incident_id) + v.node("node", node))[:64])


def _node_of(name: str, prefix: str) -> str:
    return name[len(prefix) :]


@dataclass(frozen=True, slots=True, kw_only=True)
class Restored:
    """What `restore` found and did."""

    removed_reservations: tuple[str, ...] = ()
    """Leftover reservations of this incident, deleted."""
    redrained: tuple[str, ...] = ()
    """Nodes drained again (they had been resumed)."""
    nodes: tuple[str, ...] = ()
    """The nodes the records say longrun drained for this incident."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "removed_reservations": list(self.removed_reservations),
            "redrained": list(self.redrained),
            "nodes": list(self.nodes),
        }


def remove_leftovers(client: SlurmClient, incident_id: str) -> tuple[str, ...]:
    """Delete this incident's reservations (both kinds), first cancelling the diagnostic jobs still in
    them (srun runs in a session of its own, so it may outlive the task that started it)."""
    removed = []
    prefixes = [reservation_prefix(k, incident_id) for k in (DIAG, REF)]
    for name in client.reservations():
        prefix = next((p for p in prefixes if name.startswith(p)), None)
        if prefix is None:
            continue
        node = _node_of(name, prefix)
        stuck = [
            j.job_id for j in client.jobs() if j.is_active and j.name == DIAG_JOB_NAME and j.nodes == (node,)
        ]
        for job_id in stuck:
            client.cancel(job_id)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while True:
            try:
                client.delete_reservation(name)
                break
            except SlurmCommandError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)  # the cancelled job is still completing in the reservation
        removed.append(name)
    return tuple(removed)


def _reason_from(rec: dict[str, Any]) -> str | None:
    """The reason longrun last set on the node, from the record: the verdict's, else the first drain's
    (a part that does not read is passed over: restoring the drain must not fail on it)."""
    try:
        diagnosed = Diagnosis.read_or_empty("incident", rec, "diagnosis").reason
    except SchemaError:
        diagnosed = None
    try:
        drained = Drain.read_or_empty("incident", rec, "drain").reason
    except SchemaError:
        drained = None
    for reason in (diagnosed, drained):
        if reason is not None and reason.startswith(v.DRAIN_PREFIX):
            return reason
    return None


@dataclass(frozen=True, slots=True)
class LedgerDrain:
    """A drain-ledger entry as `drained_nodes` reads it: a `DrainEntry`, or what an entry that does not read
    as one still says (its time then unknown)."""

    incident_id: str | None
    node: str | None
    time: float | None
    """None: the entry does not read (`problem` says why)."""
    problem: str = ""

    @classmethod
    def read(cls, obj: Any) -> LedgerDrain:
        try:
            e = DrainEntry.from_json(obj)
        except SchemaError as err:
            fields = obj if isinstance(obj, Mapping) else {}
            said = [f if isinstance(f := fields.get(k), str) else None for k in ("incident_id", "node")]
            return cls(said[0], said[1], None, str(err))
        return cls(e.incident_id, e.node, e.time)


def drained_nodes(store: ObjectStore, rec: dict[str, Any], incident_id: str) -> tuple[str, ...]:
    """The nodes longrun drained for the incident: the record's drain, and the ledger's grants (a drain task
    that died between its grant and its `drained` event leaves only the grant), quarantined ones included.
    An entry of the incident that does not read keeps its node (the node stays drained); one that names
    no node, or no incident, is logged and passed over."""
    nodes = []
    if record.on_timeline(rec, Event.DRAINED) and (
        node := Drain.read_or_empty("incident", rec, "drain").node
    ):
        nodes.append(node)
    for raw in ratelimit.entries_and_quarantined(store):
        e = LedgerDrain.read(raw)
        if e.problem and (e.node is None or e.incident_id is None) and e.incident_id in (incident_id, None):
            log.warning(
                "drain ledger entry %.200r does not read (%s) and names no node for incident %s: passed over",
                raw,
                e.problem,
                incident_id,
            )
        if e.incident_id == incident_id and e.node is not None:
            nodes.append(e.node)
    return tuple(v.node("node", n) for n in dict.fromkeys(nodes))


#: How long the second pass of `restore_durably` waits for a controller that does not answer.
CONTROLLER_WAIT_S = 60.0


def restore_durably(
    store: ObjectStore, client: SlurmClient, inc: Incident, *, sleep: Callable[[float], None] = time.sleep
) -> Restored:
    """`restore`, then `restore` again once slurmctld must have saved what the incident changed
    (ops.STATE_SAVE_WINDOW_S after the first): a controller that died in the window and restarted without
    the drain or the reservation deletion is put right by the second pass. For the last word on a node
    (the summary), not for steps that others follow at once. Returns what both passes did."""
    first = restore(store, client, inc)
    if not inc.plan.changes or not (first.nodes or first.removed_reservations):
        return first  # nothing of this incident's for a controller to forget
    sleep(ops.STATE_SAVE_WINDOW_S)
    deadline = time.monotonic() + CONTROLLER_WAIT_S
    while True:  # a controller still restarting answers nothing: wait for it, boundedly
        try:
            second = restore(store, client, inc)
            break
        except SlurmUnavailableError:
            if time.monotonic() >= deadline:
                raise
            sleep(2.0)
    return Restored(
        removed_reservations=first.removed_reservations + second.removed_reservations,
        redrained=first.redrained + second.redrained,
        nodes=second.nodes or first.nodes,
    )


def restore(store: ObjectStore, client: SlurmClient, inc: Incident) -> Restored:
    """Remove the incident's leftover reservations; drain again each node the records say longrun drained,
    if it no longer is. Raises ForeignDrain when someone else drained one meanwhile."""
    if not inc.plan.changes:  # observe mode changed nothing, so there is nothing to restore
        return Restored()
    # the stored JSON, not the typed record: a part that does not read must not stop the restore
    rec = record.load(store, run=inc.run, incident_id=inc.incident_id)
    removed = remove_leftovers(client, inc.incident_id)
    nodes = drained_nodes(store, rec, inc.incident_id)
    reason = _reason_from(rec) or diagnose.sdc_reason(inc.run, inc.step)
    redrained = []
    for node in nodes:
        state = client.node(node)
        if state.drain_flag and not state.is_ours:
            raise ForeignDrain(
                f"node {node}, which longrun drained for incident {inc.incident_id}, is now drained by someone"
                f" else (reason {state.reason!r}); longrun leaves it. Runbook: {runbooks.FOREIGN_DRAIN}"
            )
        if not state.drain_flag:
            client.drain(node, reason)
            redrained.append(node)
    out = Restored(removed_reservations=removed, redrained=tuple(redrained), nodes=nodes)
    if out.removed_reservations or out.redrained:
        entry = {"event": Event.RESTORED.value, "time": time.time(), **out.to_dict()}

        def change(r: dict[str, Any]) -> None:
            r["timeline"].append(entry)  # every time: each restore is part of the story

        record.update(store, run=inc.run, incident_id=inc.incident_id, change=change)
    return out
