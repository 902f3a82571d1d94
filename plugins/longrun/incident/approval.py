"""sdc_incident's approvals (Airflow human-in-the-loop): the text they show, and who may lift the drain
rate limit with one. Both treat what the job wrote as untrusted and decide only from what Airflow records.

What an approval shows: the Airflow UI renders an approval's body as Markdown. Alert records are written
by the job, so a suspect node name, a `why_unnamed` or any other alert string may carry links, images,
HTML or fake instructions. `safe_text` turns any value into inert text: control characters removed, HTML
and Markdown punctuation escaped, clipped. sdc_incident registers it as the Jinja filter `longrun_safe`.

Who may lift the drain rate limit (`decide`): an operator who approved the drain and did not trigger the
run. In `approve` mode a person approves the drain (task `approve_drain`). The approval always lets the
drain go ahead within the limits; it lifts the cluster-wide limit and the per-incident limit
(`operator_override`) only when all of these hold:

- the response is an approval and Airflow recorded who gave it (`responded_by_user`);
- the responder is listed in the Airflow Variable `longrun_drain_approvers` (a JSON list of Airflow user
  ids or names: the cluster's operators, a setting no run parameter can change);
- the responder is not the user who triggered the run (`dag_run.triggering_user_name`, which Airflow sets,
  and which a run triggered by another DAG's task inherits from that task's run); a run whose triggering
  user Airflow did not record lets nobody lift the limit (self-approval cannot be ruled out).

Without the Variable nobody lifts the limit. Everything here comes from Airflow, never from the DAG-run
conf, which whoever triggers the run writes.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

LIMIT = 2000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>:])")


def safe_text(value: Any, limit: int = LIMIT) -> str:
    """`value` (a string, or any JSON-able value) as text that renders literally in Markdown and HTML."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = _CONTROL.sub(" ", text)
    if len(text) > limit:
        text = text[:limit] + " [clipped]"
    return _MARKDOWN.sub(r"\\\1", html.escape(text, quote=True))


APPROVERS_VARIABLE = "longrun_drain_approvers"


@dataclass(frozen=True, slots=True, kw_only=True)
class OverrideDecision:
    """Whether the drain may exceed the rate limit, and why (for the log and the record)."""

    allowed: bool
    """True: `operator_override` for the drain."""
    why: str
    """One line for people."""
    approver: str | None = None
    """The responder's name (or id) when known."""


def _names(user: Any) -> set[str]:
    if not isinstance(user, Mapping):
        return set()
    return {str(user[k]) for k in ("id", "name") if isinstance(user.get(k), str | int) and str(user[k])}


def decide(
    *, response: Mapping[str, Any] | None, triggered_by: str | None, approvers: Collection[Any]
) -> OverrideDecision:
    """Decide from the approval task's result (`chosen_options`, `responded_by_user`), the run's
    triggering user and the configured approvers."""
    if not isinstance(response, Mapping) or "Approve" not in (response.get("chosen_options") or ()):
        return OverrideDecision(allowed=False, why="no approval recorded: the rate limit holds")
    who = _names(response.get("responded_by_user"))
    label = next(iter(sorted(who)), None)
    if not who:
        return OverrideDecision(
            allowed=False, why="Airflow did not record who approved: the rate limit holds"
        )
    if not isinstance(triggered_by, str) or not triggered_by.strip():
        return OverrideDecision(
            allowed=False,
            why=(
                f"Airflow did not record who triggered the run, so {label} may be the one who did: the"
                " rate limit holds"
            ),
            approver=label,
        )
    if triggered_by in who:
        return OverrideDecision(
            allowed=False,
            why=f"{triggered_by} triggered the run and approved it: the rate limit holds (another operator must approve)",
            approver=label,
        )
    listed = {str(a) for a in approvers if isinstance(a, str | int)}
    if not listed:
        return OverrideDecision(
            allowed=False,
            why=f"Variable {APPROVERS_VARIABLE} lists no operator: the rate limit holds",
            approver=label,
        )
    if not who & listed:
        return OverrideDecision(
            allowed=False,
            why=f"{label} is not an operator in Variable {APPROVERS_VARIABLE}: the rate limit holds",
            approver=label,
        )
    return OverrideDecision(
        allowed=True,
        why=f"operator {label} (not the run's trigger {triggered_by!r}) lifted the rate limit",
        approver=label,
    )
