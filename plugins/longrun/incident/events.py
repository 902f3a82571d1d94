"""The names on an incident record's timeline: one definition.

str-valued, so the JSON on disk is the same text as before the names became an enum, and records written
before still read. An event is on the timeline at most once (incident/record.py); whether it is there is
how a rerun task knows what has been done. Statuses are training.records.IncidentStatus.
"""

from __future__ import annotations

from enum import StrEnum


class Event(StrEnum):
    """Timeline event names, grouped by the step that writes them."""

    # open (incident/record.py, steps.open_record)
    OPENED = "opened"
    ALERT_SEEN = "alert_seen"
    """When the monitor's trigger saw the alert (the sensor's latency starts at the alert's time)."""
    AUTHENTICATED = "authenticated"
    """The alert checked out when the incident opened; `allocation`: Slurm's nodes of its job then."""
    # freeze
    FROZEN = "frozen"
    WOULD_FREEZE = "would_freeze"
    # attribute
    ATTRIBUTED = "attributed"
    # drain
    DRAINED = "drained"
    WOULD_DRAIN = "would_drain"
    DRAIN_REFUSED = "drain_refused"
    """The rate limit said no: nothing drained, the incident stops (status failed)."""
    FOREIGN_DRAIN = "foreign_drain"
    """The node is drained by someone else: longrun leaves it alone (status failed)."""
    DRAIN_REJECTED = "drain_rejected"
    """approve mode: a person answered Reject to `approve_drain` (Airflow's record says who); nothing
    drained, the relaunch skipped (status rejected)."""
    RESTORED = "restored"
    """keep_drained: what a dead try left (a resumed node, a reservation) was put right."""
    # diagnose
    REFERENCE = "reference"
    """The probe's known-good fingerprint, before the diagnostic runs."""
    DIAGNOSED = "diagnosed"
    WOULD_DIAGNOSE = "would_diagnose"
    DIAGNOSIS_IN_JOB_SKIPPED = "diagnosis_in_job_skipped"
    """The diagnosis could not run inside the kept job (the event says why): the reservation path runs it."""
    DIAGNOSED_IN_JOB = "diagnosed_in_job"
    """The probe ran inside the kept job (hot_spare.diagnose_in_job): its verdict, reference and output,
    as evidence only (the job could shape them); the node's verdict is decided outside the job."""
    # pick
    PICKED = "picked"
    # relaunch (full)
    RELAUNCH_SUBMITTED = "relaunch_submitted"
    RELAUNCH_FAILED = "relaunch_failed"
    RELAUNCH_LOST = "relaunch_lost"
    """The submitted relaunch job is gone, or its id now names another job (a slurmctld that died before
    saving it): the step submits again, and never follows the job holding the id. On the timeline once,
    for the first loss; `relaunched_running` or `relaunch_failed` lists every loss (`lost`)."""
    RELAUNCHED_RUNNING = "relaunched_running"
    WOULD_RELAUNCH = "would_relaunch"
    # relaunch inside the kept job (incident/hot_spare.py)
    NO_SPARE_LEFT = "no_spare_left"
    RELEASED = "released"
    """The suspect left the kept job's allocation (incident/hot_spare.py); it stays drained."""
    RELEASE_DEFERRED = "release_deferred"
    """The suspect stays in the kept job until its diagnosis has run there (a release kills its steps)."""
    RELEASE_REFUSED = "release_refused"
    """The suspect could not leave the kept job (it hosts the batch script, or Slurm refused the shrink)."""
    EARLIER_STEP_RUNNING = "earlier_step_running"
    """An earlier attempt's training step still ran in the kept job after the wait (or squeue could not
    say): no directive; the full relaunch takes over."""
    DIRECTIVE_WRITTEN = "directive_written"
    DIRECTIVE_NOT_FOLLOWED = "directive_not_followed"
    KEPT_JOB_CANCELLED = "kept_job_cancelled"
    KEPT_JOB_ENDED = "kept_job_ended"
    """Freeze kept the job for a hot spare, but it no longer ran when the relaunch came (it ended on its own,
    or Slurm lost it): the full relaunch takes over."""
    # after the relaunch (incident/recovery.py, incident/closing.py)
    FIRST_HEALTHY_STEP = "first_healthy_step"
    CLOSED = "closed"
    DRILL_ENDED = "drill_ended"
    """The drill whose incident this is ended with its closing: `state` says what of its fault state was
    removed (incident/drill_state.py)."""
