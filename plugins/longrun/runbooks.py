"""Where the runbook of each alert, check, incident outcome and procedure lives, so every alert record,
incident record and failed task can link it.

Paths are relative to the repository root. Set LONGRUN_RUNBOOK_BASE_URL to the URL of the repository root
as your users browse it (e.g. your Git host's `.../blob/main`) to get absolute links; without it, links
are the relative repository paths.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

BASE_URL_ENV = "LONGRUN_RUNBOOK_BASE_URL"

#: kind -> runbook path. Keys for the in-loop checks are training.records.schema.CHECKS names.
RUNBOOKS: dict[str, str] = {
    # alerts raised by the three in-loop checks (alert record field `check`)
    "finite": "runbooks/finite-check-alert.md",
    "recompute": "runbooks/recompute-mismatch.md",
    "weight_vote": "runbooks/weight-vote-divergence.md",
    # incident outcomes
    "ambiguous_evidence": "runbooks/ambiguous-evidence.md",
    "diagnostic_failed": "runbooks/diagnostic-failed.md",
    "diagnostic_passed": "runbooks/diagnostic-passed.md",
    "relaunch_failed": "runbooks/relaunch-failed.md",
    "node_return": "runbooks/node-return.md",
    "repeat_offender": "runbooks/repeat-offender.md",
    "security_event": "runbooks/security-event.md",
    "foreign_drain": "runbooks/node-drained-by-someone-else.md",
    # monitoring and the checkpoint gate
    "stale_heartbeat": "runbooks/stale-heartbeat.md",
    "launch_held": "runbooks/job-held-after-failed-launch.md",
    "checkpoint_validation_failed": "runbooks/checkpoint-validation-failed.md",
    "audit_failed": "runbooks/audit-failed.md",
    "dag_paused": "runbooks/dag-paused.md",
    "scheduler_restart_stall": "runbooks/scheduler-restart-stall.md",
    # procedures
    "drill": "runbooks/run-a-drill.md",
    "index": "runbooks/README.md",
}

#: Other names callers use for the same runbooks.
ALIASES: dict[str, str] = {
    "hang": "stale_heartbeat",
    "software_nondeterminism": "ambiguous_evidence",
    "rma": "diagnostic_failed",
    "return_to_service": "diagnostic_passed",
    "validation_failed": "checkpoint_validation_failed",
}


def runbook_path(kind: str) -> str:
    """The repository path of the runbook for `kind` (a RUNBOOKS key or an ALIASES key)."""
    name = ALIASES.get(kind, kind)
    try:
        return RUNBOOKS[name]
    except KeyError:
        known = sorted(set(RUNBOOKS) | set(ALIASES))
        raise KeyError(f"no runbook for kind {kind!r}; known kinds: {known}") from None


def runbook_url(kind: str, env: Mapping[str, str] | None = None) -> str:
    """A link to the runbook for `kind`: LONGRUN_RUNBOOK_BASE_URL + path, or the relative path."""
    path = runbook_path(kind)
    base = (os.environ if env is None else env).get(BASE_URL_ENV, "").strip()
    return f"{base.rstrip('/')}/{path}" if base else path
