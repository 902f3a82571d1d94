"""A drill either fires or says why not: preflight refuses a drill whose target it cannot reach.

The trainer injects a fault only on its target (a rank, or a node) at its step. A
target outside the run means a run that trains cleanly and reads "success" while proving nothing, so
preflight refuses it with the reason; what preflight cannot see (the step is never trained for another
reason) the finish catches from the trainer's fault records (longrun.incident.recovery.drill_outcome).

Rank beyond the world size and step beyond the run are refused by RunSpec itself; this adds what needs
the cluster or the checkpoint: the node is unknown, drained, down or excluded, or the run resumes past the
drill's step. A node target is also pinned into the job's node list (launch.py), so Slurm cannot leave it
out of the allocation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from longrun.runspec import RunSpec
from longrun.slurm.models import NodeState

_RESUME_STEP = re.compile(r"step-(\d{1,12})/?$")


def resume_step(resume_from: str | None) -> int | None:
    """The step of a checkpoint reference (`.../checkpoints/step-00000010/`), None if it names none."""
    m = _RESUME_STEP.search(resume_from or "")
    return int(m.group(1)) if m else None


def refusal(spec: RunSpec, nodes: Sequence[NodeState]) -> str | None:
    """Why the drill of `spec` cannot fire on this cluster, or None when it can (or there is no drill)."""
    drill = spec.drill
    if drill is None:
        return None
    start = resume_step(spec.resume_from)
    if start is not None and drill.step <= start:
        return f"step {drill.step} is at or before the resumed checkpoint's step {start}: it is never trained"
    target = drill.node
    if target is None:
        return None
    by_name = {n.name: n for n in nodes}
    node = by_name.get(target)
    if node is None:
        return f"node {target} is not a node of this cluster (known: {sorted(by_name)})"
    if target in spec.exclude:
        return f"node {target} is excluded from the run"
    if node.drain_flag:
        return f"node {target} is drained ({node.reason or 'no reason'}): it takes no job"
    if node.is_down:
        return f"node {target} is down ({node.reason or 'no reason'})"
    return None
