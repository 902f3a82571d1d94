"""Incident modes: what each step of `sdc_incident` may change.

act       do it: freeze, drain, diagnose, relaunch (the default)
approve   as act, but a person approves (Airflow human-in-the-loop) before the drain and the relaunch
observe   change nothing: attribute, pick the checkpoint, and record what act would have done

act and approve need the store's two sides (docs/security.md, item 1): with one side, whatever the job
identity writes (the drain ledger, incident records, promotions) would decide what longrun drains and rolls
back. `require_boundary` refuses them there; every sdc_incident task calls it.
"""

from __future__ import annotations

from dataclasses import dataclass

from training.records.schema import INCIDENT_MODES
from training.store.interface import ObjectStore
from training.store.sides import SidedStore

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


class UnsafeModeError(ValueError):
    """A mode that changes the cluster, on a store whose orchestrator side is not apart from the job's."""


def one_sided(store: ObjectStore) -> bool:
    """Does the job side share its place with the orchestrator side (no trust boundary)?"""
    if not isinstance(store, SidedStore):
        return True
    return store.job.describe() == store.orchestrator.describe()


def require_boundary(plan: ModePlan, store: ObjectStore) -> None:
    """Refuse a mode that may change the cluster (act, approve) when `store` has one side."""
    if plan.changes and one_sided(store):
        raise UnsafeModeError(
            f"incident_mode={plan.mode} needs the orchestrator's store side apart from the job's"
            f" (LONGRUN_ORCH_BUCKET, or LONGRUN_ORCH_STORE_DIR for a local store), and this store has one"
            f" side ({store.describe()}): a job could write what decides the drain and the relaunch."
            " Configure the second side, or run with incident_mode=observe (docs/security.md, item 1)"
        )
