"""Incident modes: what each step of `sdc_incident` may change.

act       do it: freeze, drain, diagnose, relaunch (the default)
approve   as act, but a person approves (Airflow human-in-the-loop) before the drain and the relaunch
observe   change nothing: attribute, pick the checkpoint, and record what act would have done
"""

from __future__ import annotations

from dataclasses import dataclass

from training.schema import INCIDENT_MODES

ACT, APPROVE, OBSERVE = INCIDENT_MODES


@dataclass(frozen=True, slots=True, kw_only=True)
class ModePlan:
    """The consequences of a mode, step by step."""

    mode: str
    """One of act, approve, observe."""
    changes: bool
    """May touch the cluster (cancel, drain, reserve, submit)."""
    approval: bool
    """A person must approve the drain and the relaunch first."""

    def __post_init__(self) -> None:
        if self.mode not in INCIDENT_MODES:
            raise ValueError(f"incident_mode={self.mode!r}: expected one of {INCIDENT_MODES}")


def plan(mode: str) -> ModePlan:
    if mode not in INCIDENT_MODES:
        raise ValueError(f"incident_mode={mode!r}: expected one of {INCIDENT_MODES}")
    return ModePlan(mode=mode, changes=mode != OBSERVE, approval=mode == APPROVE)
