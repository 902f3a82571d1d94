"""The repeat-offender policy: which nodes longrun may return to service on its own.

A node is never returned automatically (it is marked for replacement) when
  - any diagnostic on it failed (a probe mismatch or DCGM failure, in an incident or in node_return), or
  - it was suspected `max_suspicions` times or more within `window_s`.
The policy lives in the Airflow Variable `longrun_node_policy` (JSON; defaults below, docs/nodes.md).
History informs attribution only as a note on the incident record: it never names another node and
never widens a drain beyond what the evidence names.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longrun.health import history as h

POLICY_VARIABLE = "longrun_node_policy"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodePolicy:
    """Thresholds for returning nodes; every field has a default."""

    window_s: float = 30 * 86400.0
    """Suspicions older than this do not count towards `max_suspicions` (default 30 days)."""
    max_suspicions: int = 2
    """This many suspicions within the window make the node a repeat offender."""
    probe_repeats: int = 3
    """node_return runs the diagnostic this many times; every round must pass."""
    auto_return: bool = False
    """Scheduled node_return runs pick up `diag-pass` nodes by themselves (off: an operator triggers)."""

    def __post_init__(self) -> None:
        if (
            not isinstance(self.window_s, (int, float))
            or isinstance(self.window_s, bool)
            or self.window_s <= 0
        ):
            raise ValueError(f"window_s={self.window_s!r}: expected seconds > 0")
        if (
            not isinstance(self.max_suspicions, int)
            or isinstance(self.max_suspicions, bool)
            or self.max_suspicions < 1
        ):
            raise ValueError(f"max_suspicions={self.max_suspicions!r}: expected an integer >= 1")
        if (
            not isinstance(self.probe_repeats, int)
            or isinstance(self.probe_repeats, bool)
            or not 1 <= self.probe_repeats <= 20
        ):
            raise ValueError(f"probe_repeats={self.probe_repeats!r}: expected an integer 1..20")
        if not isinstance(self.auto_return, bool):
            raise ValueError(f"auto_return={self.auto_return!r}: expected true or false")

    @classmethod
    def from_json(cls, raw: Any) -> NodePolicy:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError(f"{POLICY_VARIABLE}={raw!r}: expected a JSON object")
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{POLICY_VARIABLE}: unknown field(s) {sorted(unknown)}")
        return cls(**raw)


@dataclass(frozen=True, slots=True, kw_only=True)
class Standing:
    """What the history says about one node."""

    node: str
    """The node."""
    suspicions_in_window: int
    """Distinct incidents that suspected it within the window."""
    failed_diagnostics: int
    """Diagnostics with verdict fail, ever (since the last return)."""
    repeat_offender: bool
    """Never return automatically (marked for replacement), for any of the reasons in `why`."""
    why: str
    """One line for people and records."""
    headline: str = ""
    """The first reason in a few words, for pages and refusals: `repeat offender` only when the suspicions
    reached the limit; `failed diagnostic` when a diagnostic failed (a node can fail its first one);
    `marked for replacement earlier` when only an earlier mark holds; empty when none holds."""

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "suspicions_in_window": self.suspicions_in_window,
            "failed_diagnostics": self.failed_diagnostics,
            "repeat_offender": self.repeat_offender,
            "why": self.why,
        }


def standing(
    node: str, evs: Sequence[h.NodeEvent], policy: NodePolicy, *, now: float | None = None
) -> Standing:
    now = time.time() if now is None else now
    suspected = {
        e.incident_id or e.source for e in evs if e.kind == h.SUSPECTED and now - e.time <= policy.window_s
    }
    # A failed diagnostic counts until a person returned the node after it (a replaced part).
    last_return = max((e.time for e in evs if e.kind == h.RETURNED), default=0.0)
    failed = [e for e in evs if e.kind == h.DIAGNOSED and e.verdict == "fail" and e.time > last_return]
    marked = any(e.kind == h.REPLACE and e.time > last_return for e in evs)
    reasons = []
    if failed:
        reasons.append(f"{len(failed)} failed diagnostic(s)")
    if len(suspected) >= policy.max_suspicions:
        reasons.append(
            f"suspected {len(suspected)} times within {policy.window_s / 86400:g} days"
            f" (limit {policy.max_suspicions})"
        )
    if marked and not reasons:
        reasons.append("marked for replacement earlier")
    offender = bool(reasons)
    if len(suspected) >= policy.max_suspicions:
        headline = "repeat offender"
    elif failed:
        headline = "failed diagnostic"
    else:
        headline = "marked for replacement earlier" if marked else ""
    why = (
        "; ".join(reasons)
        if offender
        else f"{len(suspected)} suspicion(s) within the window, no failed diagnostic"
    )
    return Standing(
        node=node,
        suspicions_in_window=len(suspected),
        failed_diagnostics=len(failed),
        repeat_offender=offender,
        why=why,
        headline=headline,
    )
