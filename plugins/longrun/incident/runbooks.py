"""Where each alert and incident outcome is explained for people: one runbook per alert, named after it.

Paths are relative to the repository root; records and task logs carry them so an operator lands on the
right page from the Airflow UI. A test checks that every file named here exists once runbooks/ lands.
"""

from __future__ import annotations

RUNBOOK_DIR = "runbooks"

FINITE_CHECK_ALERT = f"{RUNBOOK_DIR}/finite-check-alert.md"
RECOMPUTE_MISMATCH = f"{RUNBOOK_DIR}/recompute-mismatch.md"
WEIGHT_VOTE_DIVERGENCE = f"{RUNBOOK_DIR}/weight-vote-divergence.md"
AMBIGUOUS_EVIDENCE = f"{RUNBOOK_DIR}/ambiguous-evidence.md"
DIAGNOSTIC_FAILED = f"{RUNBOOK_DIR}/diagnostic-failed.md"
DIAGNOSTIC_PASSED = f"{RUNBOOK_DIR}/diagnostic-passed.md"
STALE_HEARTBEAT = f"{RUNBOOK_DIR}/stale-heartbeat.md"
CHECKPOINT_VALIDATION_FAILED = f"{RUNBOOK_DIR}/checkpoint-validation-failed.md"
AUDIT_FAILED = f"{RUNBOOK_DIR}/audit-failed.md"
RELAUNCH_FAILED = f"{RUNBOOK_DIR}/relaunch-failed.md"
DRILL = f"{RUNBOOK_DIR}/drill.md"

#: The runbook of an alert, by the check that raised it.
FOR_CHECK = {
    "finite": FINITE_CHECK_ALERT,
    "recompute": RECOMPUTE_MISMATCH,
    "weight_vote": WEIGHT_VOTE_DIVERGENCE,
}

ALL = (
    FINITE_CHECK_ALERT,
    RECOMPUTE_MISMATCH,
    WEIGHT_VOTE_DIVERGENCE,
    AMBIGUOUS_EVIDENCE,
    DIAGNOSTIC_FAILED,
    DIAGNOSTIC_PASSED,
    STALE_HEARTBEAT,
    CHECKPOINT_VALIDATION_FAILED,
    AUDIT_FAILED,
    RELAUNCH_FAILED,
    DRILL,
)


def for_check(check: str) -> str:
    """The runbook for an alert of `check` (the ambiguous-evidence one for a check we do not know)."""
    return FOR_CHECK.get(check, AMBIGUOUS_EVIDENCE)
