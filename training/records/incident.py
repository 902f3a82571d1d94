"""The parts of an incident record besides the diagnosis (training/records/diagnosis.py): the attribution,
the drain, the restart checkpoint and the relaunch, as sdc_incident's steps return them and the record
keeps them. Reading and writing: `Part` in training/records/base.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.records.base import PART, Part
from training.records.fields import (
    opt_bool,
    opt_float,
    opt_int,
    opt_ints,
    opt_job_id,
    opt_obj,
    opt_str,
    opt_strs,
    while_set,
)


@PART
class Attribution(Part):
    """The attribute step's result and the record's `attribution` (incident/attribution.py writes it)."""

    PART = "attribution"
    verdict: str | None = None
    """`node` (one suspect node) or `ambiguous` (suspect software; drain nothing)."""
    node: str | None = None
    """The suspect node when the verdict is `node` (null otherwise)."""
    ranks: tuple[int, ...] | None = None
    reason: str | None = None
    runbook: str | None = None

    FIELDS = while_set(verdict=opt_str, node=opt_str, ranks=opt_ints, reason=opt_str, runbook=opt_str)

    @property
    def ambiguous(self) -> bool:
        return self.verdict == "ambiguous"


@PART
class RestartCheckpoint(Part):
    """The pick step's choice and the record's `checkpoint`: the step to resume from (0: a clean start),
    its store key (null for a clean start) and why; the step's result adds the lost steps."""

    PART = "checkpoint"
    step: int | None = None
    key: str | None = None
    why: str | None = None
    lost_steps: int | None = None

    FIELDS = while_set(step=opt_int, key=opt_str, why=opt_str, lost_steps=opt_int)


@PART
class Relaunch(Part):
    """The relaunch step's result and the record's `relaunch`: the job that runs again, where, and from
    which checkpoint; `in_job` when it recovered inside the kept job; `observe` marks observe mode's
    would-be relaunch (only `params` and `note` besides)."""

    PART = "relaunch"
    job_id: int | str | None = None
    nodes: tuple[str, ...] | None = None
    exclude: tuple[str, ...] | None = None
    resume_from: str | None = None
    attempt: int | None = None
    note: str | None = None
    params: Mapping[str, Any] | None = None
    """The relaunched run's params (a RunSpec's)."""
    in_job: bool | None = None
    observe: bool | None = None

    FIELDS = while_set(
        job_id=opt_job_id,
        nodes=opt_strs,
        exclude=opt_strs,
        resume_from=opt_str,
        attempt=opt_int,
        note=opt_str,
        params=opt_obj,
        in_job=opt_bool,
        observe=opt_bool,
    )


@PART
class Drain(Part):
    """The drain step's result and the record's `drain`: the node, the reason it carries, whether this
    drain set it, and the drains in the rate limit's window; `rerun` and `observe` mark a result
    returned again and observe mode's would-be drain."""

    PART = "drain"
    node: str | None = None
    reason: str | None = None
    drained_now: bool | None = None
    in_window: int | None = None
    """Drains in the rate limit's window, this one included."""
    rerun: bool | None = None
    observe: bool | None = None

    FIELDS = while_set(
        node=opt_str,
        reason=opt_str,
        drained_now=opt_bool,
        in_window=opt_int,
        rerun=opt_bool,
        observe=opt_bool,
    )


@PART
class Recovery(Part):
    """The record's `recovery`, measured once the relaunch trained a healthy step
    (longrun.incident.recovery.measure): the milestones in seconds after the alert record, the headline
    time, the resume proof and the steps lost. A field that could not be measured is null."""

    PART = "recovery"
    milestones_s: Mapping[str, Any] | None = None
    """Timeline event -> seconds after the alert record (null: it did not happen)."""
    alert_to_first_healthy_step_s: float | None = None
    relaunch_segment: str | None = None
    pick_step: int | None = None
    start_step: int | None = None
    first_step: int | None = None
    resumed_as_picked: bool | None = None
    """The relaunch's first step is the one after the picked checkpoint."""
    lost_steps: int | None = None

    FIELDS = while_set(
        milestones_s=opt_obj,
        alert_to_first_healthy_step_s=opt_float,
        relaunch_segment=opt_str,
        pick_step=opt_int,
        start_step=opt_int,
        first_step=opt_int,
        resumed_as_picked=opt_bool,
        lost_steps=opt_int,
    )


@PART
class Closing(Part):
    """The record's `closed`, set once when the incident closes (longrun.incident.closing): when, by whom
    (`longrun` when it closed itself), why, and the healthy steps that closed it (null: an operator)."""

    PART = "closed"
    time: float | None = None
    by: str | None = None
    reason: str | None = None
    healthy_steps: int | None = None

    FIELDS = while_set(time=opt_float, by=opt_str, reason=opt_str, healthy_steps=opt_int)


__all__ = ["Attribution", "Closing", "Drain", "Recovery", "Relaunch", "RestartCheckpoint"]
