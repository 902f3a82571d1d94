"""Errors of the Slurm layer, in two families: retry the task, or fail it for good.

    SlurmError
    ├── RetryableSlurmError            another try may succeed (Airflow retries the task)
    │   ├── SlurmUnavailableError      a Slurm command timed out or the controller did not answer
    │   ├── JobRetryableError          the job ended for reasons outside it: node failure, preemption
    │   └── JobLostError               the job a caller submitted is gone, or its id now names another job
    └── TerminalSlurmError             retrying cannot help (Airflow fails the task without retry)
        ├── InvalidSpecError           a value would be unsafe or absurd on a Slurm command line
        ├── SubmitRejectedError        sbatch refused the job (bad partition, impossible request)
        ├── JobNotFoundError           neither Slurm nor the durable job record knows the job
        ├── JobFailedError             the job failed, was cancelled, timed out or used up its restarts
        │   └── SdcVerdictError        the job exited with the SDC verdict code (93): never retried
        ├── SlurmCommandError          a Slurm command failed with an error that will not go away
        ├── ForeignDrainError          a node is drained for a reason longrun did not set
        └── BackendUnavailableError    the requested backend cannot be used here (pyslurm missing)

Callers decide with one `isinstance(err, RetryableSlurmError)`; messages say what happened and what to
do, and carry the Slurm state, reason and exit code where there is a job.
"""

from __future__ import annotations


class SlurmError(Exception):
    """Base of every error raised by longrun's Slurm layer."""


class RetryableSlurmError(SlurmError):
    """A later attempt may succeed."""


class TerminalSlurmError(SlurmError):
    """No later attempt can succeed without a change by a person."""


class SlurmUnavailableError(RetryableSlurmError):
    """A Slurm command timed out or could not reach the controller."""


class JobRetryableError(RetryableSlurmError):
    """The job ended for a reason outside it (node failure, preemption): submit it again."""


class JobLostError(RetryableSlurmError):
    """The job a caller submitted is no longer the job behind its id: Slurm forgot it (a slurmctld that died
    before saving its state purges the job on restart) or gave its id to another job. Submit it again;
    never act on the job now holding the id."""


class InvalidSpecError(TerminalSlurmError, ValueError):
    """A value refused by validation; the message names the field and the bad value."""

    def __init__(self, field: str, value: object, why: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field}={value!r}: {why}")


class SubmitRejectedError(TerminalSlurmError):
    """sbatch refused the job."""


class JobNotFoundError(TerminalSlurmError):
    """Neither Slurm nor the durable job record knows this job id."""


class JobFailedError(TerminalSlurmError):
    """The job reached a final state that is not success and is not worth retrying."""


class SdcVerdictError(JobFailedError):
    """The job exited with the SDC verdict code: a check convicted a node; restarting in place is wrong."""


class SlurmCommandError(TerminalSlurmError):
    """A Slurm command failed with an error that retrying will not fix."""


class ForeignDrainError(TerminalSlurmError):
    """A node is drained (or down) for a reason that does not carry longrun's prefix; we leave it alone."""


class BackendUnavailableError(TerminalSlurmError):
    """The requested Slurm backend cannot be used on this machine."""
