"""A run's fault state: which probe may read it (only in an operator's drill), and its removal when the
drill's incident closes.

The replay probe takes `--state-dir`: a node whose marker `sick-nodes/<node>` is in that dir computes
wrong on purpose, so the probe fails and the node is drained as sick and marked for replacement. The dir
is the run's, and the run's jobs write it: handed to a probe outside a drill, any job could convict any
node it names. So a probe gets the dir only when the orchestrator's own records say this is a sick-node
drill an operator set (longrun.drill_grant) on the node probed, that drill has not ended, and the store
keeps those records apart from the job's (two sides: on one side the job could write the grant itself):

- the incident's diagnosis (`for_diagnosis`): also only when the incident's job is the drill's launch
  (submitted by the granted training_run DAG run, by the key record bound to the job at submit);
- `node_return`'s probes (`for_return`): the run that drained the node, by longrun's drain reason.

Outside a drill they get no dir, and a marker a job wrote is never read. When the drill's incident closes
(`end`, called by longrun.incident.closing), the drill's marker is removed and the grant ended; the
incident's timeline gets a `drill_ended` event saying what was removed.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from longrun import drill_grant
from longrun.drill_grant import DrillGrant
from longrun.incident import record
from longrun.incident.events import Event
from longrun.incident.modes import one_sided
from training.store.interface import ObjectStore

log = logging.getLogger("longrun.incident")

SICK_NODE = "sick-node"


def _sick_node_drill(store: ObjectStore, run: str, node: str) -> DrillGrant | None:
    """The run's granted, unended sick-node drill on `node`, or None."""
    if one_sided(store):
        return None
    rec = drill_grant.read(store, run)
    if rec is None or not rec.active or rec.kind != SICK_NODE or rec.node != node:
        return None
    return rec


def for_diagnosis(store: ObjectStore, *, run: str, node: str, job_id: int | None) -> str | None:
    """The fault-state dir the incident's diagnosis of `node` may hand the probe, or None (no dir)."""
    rec = _sick_node_drill(store, run, node)
    if rec is None or not drill_grant.launched_by(store, rec, job_id):
        return None
    return rec.fault_state_dir


def for_return(store: ObjectStore, *, run: str, node: str) -> str | None:
    """The fault-state dir node_return's probes of `node` may read (`run`: the run whose incident drained
    it, from longrun's drain reason), or None."""
    return rec.fault_state_dir if (rec := _sick_node_drill(store, run, node)) else None


def _remove_marker(rec: DrillGrant) -> str:
    """Remove the drill's sick-node marker; what happened, in words."""
    if rec.kind != SICK_NODE or rec.node is None:
        return f"nothing to remove: a {rec.kind} drill leaves no state"
    marker = os.path.join(rec.fault_state_dir, "sick-nodes", rec.node)
    try:
        os.unlink(marker)
    except FileNotFoundError:
        return f"{marker} was not there (removed before, or not visible from this machine)"
    except OSError as e:
        return f"{marker} could not be removed: {e}"
    return f"removed {marker}"


def end(store: ObjectStore, *, run: str, incident_id: str, job_id: int | None) -> dict[str, Any] | None:
    """If the closed incident `incident_id` is the drill's (its job is the drill's launch): remove the
    drill's marker, end the grant, and put `drill_ended` on the incident's timeline. The incident record
    afterwards; None when it is no drill's incident."""
    rec = drill_grant.read(store, run)
    if rec is None or one_sided(store) or not drill_grant.launched_by(store, rec, job_id):
        return None
    removed = _remove_marker(rec) if rec.active else "ended before"
    drill_grant.end(store, run, incident_id=incident_id)
    log.warning("drill %s:%s:%s of run %s ended with incident %s: %s",
                rec.kind, rec.step, rec.target, run, incident_id, removed)  # fmt: skip
    return record.add_event(
        store,
        run=run,
        incident_id=incident_id,
        name=Event.DRILL_ENDED,
        drill=f"{rec.kind}:{rec.step}:{rec.target}",
        set_by=rec.set_by,
        state=removed,
    )
