"""The outcome table: every status lands somewhere, SDC and exhausted restarts are terminal."""

from __future__ import annotations

import pytest
from longrun.slurm.models import JobState, JobStatus
from longrun.slurm.outcomes import TABLE, Kind, classify, held_after_failed_launch

from training.records.schema import EXIT_SDC_VERDICT as SDC_EXIT_CODE


def state(status, exit_code=None, restarts=0):
    return JobState(
        job_id=7, status=status, slurm_state=status.name, exit_code=exit_code, restart_count=restarts
    )


def test_every_status_is_in_the_table():
    assert set(TABLE) == set(JobStatus)


@pytest.mark.parametrize(
    ("status", "exit_code", "kind", "label"),
    [
        (JobStatus.COMPLETED, 0, Kind.SUCCESS, "completed"),
        (JobStatus.FAILED, 3, Kind.TERMINAL, "failed"),
        (JobStatus.FAILED, SDC_EXIT_CODE, Kind.TERMINAL, "sdc_verdict"),
        (JobStatus.CANCELLED, None, Kind.TERMINAL, "cancelled"),
        (JobStatus.TIMEOUT, None, Kind.TERMINAL, "timeout"),
        (JobStatus.NODE_FAIL, None, Kind.RETRYABLE, "node_fail"),
        (JobStatus.PREEMPTED, None, Kind.RETRYABLE, "preempted"),
        (JobStatus.BOOT_FAIL, None, Kind.RETRYABLE, "boot_fail"),
        (JobStatus.OUT_OF_MEMORY, None, Kind.TERMINAL, "out_of_memory"),
        (JobStatus.PENDING, None, Kind.RUNNING, "pending"),
        (JobStatus.RUNNING, None, Kind.RUNNING, "running"),
        (JobStatus.REQUEUED, None, Kind.RUNNING, "requeued"),
    ],
)
def test_table(status, exit_code, kind, label):
    out = classify(state(status, exit_code))
    assert (out.kind, out.label) == (kind, label)
    assert str(7) in out.message


def test_sdc_code_is_terminal_even_when_slurm_calls_it_node_fail():
    assert classify(state(JobStatus.NODE_FAIL, SDC_EXIT_CODE)).label == "sdc_verdict"


def test_exhausted_restarts_are_terminal_but_success_stays_success():
    assert classify(state(JobStatus.REQUEUED, restarts=3), max_restarts=2).label == "restarts_exhausted"
    assert classify(state(JobStatus.NODE_FAIL, restarts=3), max_restarts=2).kind is Kind.TERMINAL
    assert classify(state(JobStatus.NODE_FAIL, restarts=2), max_restarts=2).kind is Kind.RETRYABLE
    assert classify(state(JobStatus.COMPLETED, 0, restarts=9), max_restarts=2).kind is Kind.SUCCESS


@pytest.mark.parametrize(
    ("status", "reason", "held"),
    [
        # Slurm's own holds after a failed launch, as scontrol (underscores) and JSON/pyslurm (spaces) say
        (JobStatus.REQUEUED, "launch_failed_requeued_held", True),
        (JobStatus.PENDING, "launch failed requeued held", True),
        (JobStatus.REQUEUED, "user_env_retrieval_failed_requeued_held", True),
        # holds someone chose: longrun's requeue-hold (ops.requeue_excluding) and an operator's
        (JobStatus.REQUEUED, "job_requeued_in_held_state", False),
        (JobStatus.PENDING, "JobHeldAdmin", False),
        (JobStatus.PENDING, "JobHeldUser", False),
        (JobStatus.PENDING, "Resources", False),
        (JobStatus.PENDING, None, False),
        # the reason of a job that has left the queue is history, not a hold
        (JobStatus.CANCELLED, "launch_failed_requeued_held", False),
    ],
)
def test_only_slurms_own_hold_after_a_failed_launch_counts(status, reason, held):
    s = JobState(job_id=7, status=status, slurm_state="PENDING", reason=reason, held=reason is not None)
    assert held_after_failed_launch(s) is held
    assert classify(s).kind is TABLE[status][0]  # the table is unchanged: the monitor acts on the hold
