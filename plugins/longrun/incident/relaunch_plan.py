"""The relaunch's RunSpec: the alerting attempt's spec, resumed, the suspect node excluded, drill off.

The same world when enough healthy nodes remain, else smaller (and said so). Used by the full relaunch
(step_relaunch.py) and the in-job one (hot_spare.py), so it is a module of its own: the full relaunch
falls back from the in-job one.
"""

from __future__ import annotations

import dataclasses

from longrun.incident import runbooks
from longrun.incident.runner import Incident, IncidentStop
from longrun.monitor.lifecycle import spec_from_params
from longrun.runspec import RunSpec
from longrun.slurm.client import SlurmClient


def run_spec(inc: Incident) -> RunSpec:
    """The RunSpec of the attempt that raised the alert (its DAG run's params minus the attach fields)."""
    return spec_from_params(inc.run_params)


def healthy_nodes(client: SlurmClient, inc: Incident, *, exclude: tuple[str, ...]) -> list[str]:
    """Nodes a relaunch may use: neither drained nor down, nor excluded by the incident or the run."""
    run_exclude = run_spec(inc).exclude
    return [
        n.name
        for n in client.nodes()
        if not n.drain_flag and not n.is_down and n.name not in exclude and n.name not in run_exclude
    ]


def relaunch_spec(
    inc: Incident, *, resume_from: str | None, exclude: tuple[str, ...], healthy: int
) -> tuple[RunSpec, str]:
    """The RunSpec of the relaunch: the same world when enough healthy nodes remain, else smaller."""
    spec = run_spec(inc).relaunch(resume_from=resume_from, exclude=exclude)
    note = f"world kept: {spec.nodes} node(s)"
    # a full relaunch holds only the spares that are left (it would pend forever waiting for more)
    spec = dataclasses.replace(spec, spare_nodes=min(spec.spare_nodes, max(0, healthy - spec.nodes)))
    if healthy < spec.nodes:
        if healthy < 1:
            raise IncidentStop(f"no healthy node left to relaunch on. Runbook: {runbooks.RELAUNCH_FAILED}")
        note = f"world SHRUNK from {spec.nodes} to {healthy} node(s): no spare left (results differ in bits)"
        spec = dataclasses.replace(spec, nodes=healthy)
    return spec, note
