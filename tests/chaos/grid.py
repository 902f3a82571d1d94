"""The fault matrix's grid, without anything it needs a stack for: the steps, the components, every cell,
and which steps begin only after a step ends (what makes a kill "missed").

Its own module so that the artefact writer, the table generator and the rotation (tests/chaos/artefact.py,
table.py, rotation.py) can be used without the stack's imports; tests/chaos/harness.py recognises the
steps and tests/chaos/test_matrix.py orders the cells.
"""

from __future__ import annotations

import itertools

AIRFLOW_DAEMONS = ("scheduler", "triggerer", "dag-processor")
COMPONENTS = (*AIRFLOW_DAEMONS, "task", "slurmctld", "slurmd", "s3")
STEPS = (
    "monitor",
    "hand_over",
    "freeze",
    "attribute",
    "drain",
    "diagnose",
    "pick",
    "relaunch",
    "reenter",
    "promotion",
)
# Every (step, component), steps in the order above, then components in the order above: the order the
# rotation counts in and the table is drawn in (not the order the matrix runs its cells in).
GRID: tuple[tuple[str, str], ...] = tuple(itertools.product(STEPS, COMPONENTS))

# The hot-spare row (not part of the 70, nor of the rotation): the run holds a spare node (spare_nodes=1)
# and recovers inside its job (plugins/longrun/incident/hot_spare.py); the component is killed mid-recovery,
# once the relaunch task wrote the directive (timeline `directive_written`) and before the job's supervisor
# started the next attempt in the kept allocation (`relaunched_running`).
SPARE_STEPS = ("spare_directive",)
SPARE_GRID: tuple[tuple[str, str], ...] = tuple(itertools.product(SPARE_STEPS, COMPONENTS))
# Recognised only to end a hot-spare step's window: the supervisor started the attempt inside the job.
SPARE_LATER = ("spare_running",)

# step -> the steps that can only begin after it ended: a kill that lands when one of them has begun missed
# its step. Not simply the next entry of STEPS: in `sdc_incident` (dags/sdc_incident.py) freeze runs beside
# attribute and diagnose beside pick, and diagnose also beside the relaunch and the re-entry. So freeze and
# attribute are over once the steps waiting for them (drain after attribute; diagnose and pick after the
# drain and the freeze) begin. diagnose, re-enter and promotion have no later step that waits for them and
# is recognised from outside (the summary task, the run's finish): their kills are never called missed. The
# hot-spare row's window ends when the supervisor started the attempt inside the job.
NEXT: dict[str, tuple[str, ...]] = {
    "monitor": ("hand_over",),
    "hand_over": ("freeze",),
    "freeze": ("diagnose", "pick"),
    "attribute": ("drain",),
    "drain": ("diagnose", "pick"),
    "diagnose": (),
    "pick": ("relaunch",),
    "relaunch": ("reenter",),
    "reenter": (),
    "promotion": (),
    "spare_directive": ("spare_running",),
    "spare_running": (),
}
