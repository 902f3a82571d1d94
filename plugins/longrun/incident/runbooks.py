"""The runbooks the incident steps link, by outcome (paths from `longrun.runbooks`, the one table)."""

from __future__ import annotations

from longrun.runbooks import runbook_path

AMBIGUOUS_EVIDENCE = runbook_path("ambiguous_evidence")
DIAGNOSTIC_FAILED = runbook_path("diagnostic_failed")
DIAGNOSTIC_PASSED = runbook_path("diagnostic_passed")
RELAUNCH_FAILED = runbook_path("relaunch_failed")
FOREIGN_DRAIN = runbook_path("foreign_drain")
STALE_HEARTBEAT = runbook_path("stale_heartbeat")
CHECKPOINT_VALIDATION_FAILED = runbook_path("checkpoint_validation_failed")
RECOMPUTE_MISMATCH = runbook_path("recompute")
FOR_CHECK = {check: runbook_path(check) for check in ("finite", "recompute", "weight_vote")}


def for_check(check: str) -> str:
    """The runbook for an alert of `check` (the ambiguous-evidence one for a check we do not know)."""
    return FOR_CHECK.get(check, AMBIGUOUS_EVIDENCE)
