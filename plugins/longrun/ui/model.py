"""What the run-health page shows, as plain values: built by `longrun.ui.data`, drawn by `page` and `plots`.

No Airflow, no matplotlib, no store access here: every field is already read and parsed, so the page and
the plots are pure functions of a `RunHealth`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longrun.runview import STATES
from longrun.votes import Vote as VotePoint  # the read model's weight-vote agreement, shown as is

CHECKPOINT_STATES = STATES


def _require(cond: bool, name: str, value: object, what: str) -> None:
    if not cond:
        raise ValueError(f"{name} = {value!r}: {what}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckEvent:
    """One check result at one step (a pass, a skip, a failure) or one alert."""

    step: int
    """The step checked."""
    check: str
    """schema.CHECKS name: finite, recompute, weight_vote."""
    verdict: str
    """'pass', 'fail', 'skip', or 'alert' for an alert record."""
    duration_s: float | None = None
    """Time the check took in that step (None for alerts)."""
    suspect_ranks: tuple[int, ...] = ()
    """Ranks a majority named (alerts and failures)."""
    suspect_nodes: tuple[str, ...] = ()
    """Nodes of the suspect ranks."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """The record's evidence, as written."""

    def __post_init__(self) -> None:
        _require(self.step >= 0, "step", self.step, "must be >= 0")
        _require(self.verdict in ("pass", "fail", "skip", "alert"), "verdict", self.verdict, "unknown")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointView:
    """One checkpoint and what the gate decided about it."""

    step: int
    """The checkpoint's step."""
    state: str
    """The most telling state: suspect > promoted > validated/invalid > saved."""
    time: float | None = None
    """When the manifest was written (epoch seconds)."""
    validation_errors: tuple[str, ...] = ()
    """Errors of the newest failed validation, if the checkpoint is invalid."""
    current: bool = False
    """The promotion pointer names this checkpoint."""

    def __post_init__(self) -> None:
        _require(self.state in CHECKPOINT_STATES, "state", self.state, f"expected one of {CHECKPOINT_STATES}")


@dataclass(frozen=True, slots=True, kw_only=True)
class IncidentView:
    """One incident record, flattened for the page."""

    incident_id: str
    """The record's id (its key under incidents/)."""
    mode: str
    """act, approve or observe."""
    step: int | None
    """The alert's step."""
    check: str | None
    """The check that raised the alert."""
    suspect_nodes: tuple[str, ...]
    """Nodes the evidence named."""
    status: str | None
    """Where the incident stands: open, ambiguous, observed, rejected, relaunched, failed."""
    verdict: str | None
    """The diagnosis verdict, once there is one."""
    timeline: tuple[dict[str, Any], ...]
    """The record's timeline entries, in order."""
    runbooks: tuple[str, ...]
    """Runbook names (files under runbooks/, without .md) the record links, first the alert's."""
    restart_step: int | None = None
    """The checkpoint step the relaunch started from, once chosen."""
    facts: tuple[tuple[str, str], ...] = ()
    """Label and value of what was done: attribution, drain, checkpoint, lost steps, relaunch, recovery."""
    plots: tuple[str, ...] = ()
    """Store keys of the PNG plots saved with the record."""
    record: dict[str, Any] = field(default_factory=dict)
    """The whole record, for the raw view."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """One Slurm node as the operator needs to see it."""

    name: str
    """Node name."""
    state: str
    """Base state plus flags, e.g. 'idle+DRAIN'."""
    reason: str | None
    """Drain reason, if any."""
    ours: bool
    """The reason carries longrun's prefix (longrun drained it, longrun may resume it)."""
    this_run: bool
    """The reason names this run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunHealth:
    """Everything the run-health page shows about one run."""

    run: str
    """The run name."""
    step: int | None = None
    """Latest step from the heartbeat."""
    total_steps: int | None = None
    """Planned steps, when the heartbeat or the report says."""
    loss: float | None = None
    """Latest loss."""
    step_time_s: float | None = None
    """Latest step time."""
    heartbeat_age_s: float | None = None
    """Seconds since the last heartbeat, at the time of reading."""
    finished: bool = False
    """A run report exists."""
    final_fingerprint: str | None = None
    """The report's fingerprint of the final weights."""
    loss_series: tuple[tuple[int, float], ...] = ()
    """(step, loss) pairs from every record that carries a loss, sorted by step."""
    step_time_series: tuple[tuple[int, float], ...] = ()
    """(step, step time) pairs where records carry one."""
    checks: tuple[CheckEvent, ...] = ()
    """Check results of the newest `checks_window` steps, and every alert, sorted by step."""
    checks_window: int | None = None
    """How many of the newest steps `checks` and `votes` cover (None: the whole run)."""
    votes: tuple[VotePoint, ...] = ()
    """Weight-vote agreement over the steps `checks` covers."""
    checkpoints: tuple[CheckpointView, ...] = ()
    """Checkpoints, sorted by step."""
    incidents: tuple[IncidentView, ...] = ()
    """Incident records, oldest first."""
    nodes: tuple[NodeView, ...] = ()
    """Slurm nodes (all of the cluster's; the run's own drains marked)."""
    nodes_error: str | None = None
    """Why node states are missing, when they are."""
    problems: tuple[str, ...] = ()
    """Records that could not be read (key and reason): shown, never fatal."""

    def __post_init__(self) -> None:
        _require(bool(self.run), "run", self.run, "must not be empty")

    @property
    def alerts(self) -> tuple[CheckEvent, ...]:
        return tuple(c for c in self.checks if c.verdict == "alert")

    def check_counts(self) -> dict[str, dict[str, int]]:
        """check -> verdict -> count."""
        out: dict[str, dict[str, int]] = {}
        for c in self.checks:
            per = out.setdefault(c.check, {})
            per[c.verdict] = per.get(c.verdict, 0) + 1
        return out
