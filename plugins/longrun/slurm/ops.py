"""Operations built from several client calls, written once against the `SlurmClient` interface.

Each has a bounded wait and cleans up in `finally` what it changed, so a failure midway leaves the
cluster as it found it (a drained node stays drained; a reservation is deleted).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from longrun.slurm import validate as v
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import (
    ForeignDrainError,
    JobLostError,
    JobNotFoundError,
    SlurmError,
    SlurmUnavailableError,
)
from longrun.slurm.models import CommandResult, JobState, JobStatus
from longrun.slurm.spec import JobSpec

log = logging.getLogger("longrun.slurm.ops")
# Measured here: releasing sooner than ~2 s after requeuehold failed 1 run in 4 with "Job credential revoked".
REQUEUE_SETTLE_S = 2.0
#: How long a job this caller submitted may be unknown to Slurm (controller and durable record alike) before
#: it counts as lost. sbatch answers only once the controller holds the job, so an unknown id is not a
#: job "not visible yet"; the margin covers a controller restarting under the caller.
LOST_AFTER_S = 30.0
#: How long an acknowledged change (a drain, a reason, a deleted reservation) may live only in slurmctld's
#: memory: its state-save thread writes changed state at most every 5 s (SAVE_MAX_WAIT in slurmctld), so a
#: controller killed sooner restarts without the change, although `scontrol` said it was made (seen in the
#: fault matrix: a drain and a reservation deletion undone by a SIGKILL 3 s later). Whoever must know a
#: change holds reads Slurm again once this much has passed since it made it: a controller that answers
#: then either saved the change or lost it visibly.
STATE_SAVE_WINDOW_S = 6.0


def wait_for(
    client: SlurmClient,
    job_id: int,
    until: Callable[[JobState], bool],
    *,
    timeout_s: float,
    poll_s: float = 0.2,
    own: tuple[str, str] | None = None,
    lost_after_s: float = math.inf,
) -> JobState:
    """Poll one job until `until(state)` holds; SlurmUnavailableError after `timeout_s`. An id Slurm does
    not know is waited through (just submitted, or between controller and jobcomp) for up to
    `lost_after_s`, then JobLostError. `own` = (tag prefix, job name): the job the caller submitted
    itself, and JobLostError as soon as the id names another job (`not_the_job`)."""
    deadline = time.monotonic() + timeout_s
    unknown_since: float | None = None
    last: JobState | None = None
    while True:
        now = time.monotonic()
        try:
            last = client.job(job_id)
            unknown_since = None
            if own is not None and (why := not_the_job(last, tag_prefix=own[0], name=own[1])):
                raise JobLostError(f"the job submitted as {job_id} is lost: {why}")
            if until(last):
                return last
        except JobNotFoundError:
            unknown_since = now if unknown_since is None else unknown_since
            if now - unknown_since >= lost_after_s:
                raise JobLostError(
                    f"the job submitted as {job_id} is lost: Slurm has not known the id for"
                    f" {now - unknown_since:.0f} s"
                ) from None
        if now >= deadline:
            seen = last.describe() if last else "never seen"
            raise SlurmUnavailableError(f"job {job_id}: condition not reached within {timeout_s} s ({seen})")
        time.sleep(poll_s)


def not_the_job(state: JobState, *, tag_prefix: str, name: str) -> str | None:
    """None when `state` can be the job submitted with a comment starting `tag_prefix` and job name `name`;
    else why it is another job holding the same id.

    Slurm reuses job ids: a slurmctld killed before it saved a job it had just accepted purges that job on
    restart and hands its id to the next submission (seen in the fault matrix: the relaunch's id went to
    the diagnosis probe's allocation on the drained node). Every source but the durable record (jobcomp)
    reports the comment, and longrun's jobs always carry one, so a missing comment there is another job's."""
    if state.comment:
        if not state.comment.startswith(tag_prefix):
            return f"job {state.job_id} now carries the comment {state.comment[:80]!r}, not {tag_prefix!r}"
    elif state.source != "jobcomp":
        return (
            f"job {state.job_id} carries no comment ({state.source or 'unknown source'}), not {tag_prefix!r}"
        )
    if state.name and state.name != name:
        return f"job {state.job_id} is named {state.name!r}, not {name!r}"
    return None


def wait_for_own(
    client: SlurmClient,
    job_id: int,
    until: Callable[[JobState], bool],
    *,
    tag_prefix: str,
    name: str,
    timeout_s: float,
    lost_after_s: float = LOST_AFTER_S,
    poll_s: float = 0.2,
) -> JobState:
    """`wait_for` on a job the caller submitted itself, tagged `tag_prefix` and named `name`: JobLostError
    as soon as the id names another job (`not_the_job`), or once Slurm has not known the id at all for
    `lost_after_s`. Then the caller submits again; it never follows or acts on the job holding the id."""
    return wait_for(
        client, job_id, until, timeout_s=timeout_s, poll_s=poll_s, own=(tag_prefix, name),
        lost_after_s=lost_after_s,
    )  # fmt: skip


def wait_status(
    client: SlurmClient,
    job_id: int,
    statuses: Collection[JobStatus],
    *,
    timeout_s: float,
    poll_s: float = 0.2,
) -> JobState:
    return wait_for(client, job_id, lambda s: s.status in statuses, timeout_s=timeout_s, poll_s=poll_s)


def requeue_excluding(
    client: SlurmClient, job_id: int, exclude: tuple[str, ...], *, timeout_s: float = 60.0
) -> JobState:
    """Stop a running job, put it back in the queue away from `exclude`, and let it start again.

    requeuehold -> wait until held and >= 2 s -> ExcNodeList + StartTime=now -> release (~3 s to running,
    against ~121 s for a plain requeue). Keeps the job id, so watchers stay attached.
    """
    v.nodes("exclude", exclude)
    started = time.monotonic()
    client.requeue_hold(job_id)
    wait_for(
        client,
        job_id,
        lambda s: s.held and s.status in (JobStatus.PENDING, JobStatus.REQUEUED),
        timeout_s=timeout_s,
    )
    time.sleep(max(0.0, REQUEUE_SETTLE_S - (time.monotonic() - started)))
    client.set_excluded(job_id, exclude)
    client.release(job_id)
    return client.job(job_id)


def cancel_and_relaunch(
    client: SlurmClient, job_id: int, spec: JobSpec, exclude: tuple[str, ...], *, timeout_s: float = 60.0
) -> int:
    """Cancel `job_id`, wait until it is final, submit `spec` again with `exclude` added; the new job id."""
    client.cancel(job_id)
    wait_for(client, job_id, lambda s: s.is_terminal, timeout_s=timeout_s)
    merged = tuple(dict.fromkeys((*spec.exclude, *exclude)))
    return client.submit(dataclasses.replace(spec, exclude=merged))


def run_on_drained_node(
    client: SlurmClient,
    node: str,
    argv: tuple[str, ...],
    *,
    verdict: str | Callable[[CommandResult], str],
    timeout_s: float = 300.0,
    reservation: str | None = None,
    hold_min: int | None = None,
) -> CommandResult:
    """Run a diagnostic on a node longrun drained, without letting any other job onto it.

    A drained node takes no job at all, so: create a MAINT reservation on it, resume it inside the
    reservation, srun the command there, drain it again with the verdict (a reason with longrun's prefix,
    or a function of the result that returns one), delete the reservation. If the command could not run,
    the node is drained again with its old reason. `hold_min`: the reservation's duration (default: the
    timeout plus 5 minutes); longer keeps the node out of service if this process dies midway.
    """
    v.node("node", node)
    if isinstance(verdict, str):
        v.reason("verdict", verdict, ours=True)
    before = client.node(node)
    if not before.drain_flag or not before.is_ours:
        raise ForeignDrainError(
            f"node {node} is not drained by longrun (state {before.state}, reason {before.reason!r}):"
            " diagnose only nodes longrun drained"
        )
    assert before.reason is not None
    name = reservation or f"longrun_diag_{node}_{int(time.time())}"
    client.create_maint_reservation(name, (node,), duration_min=hold_min or math.ceil(timeout_s / 60) + 5)
    reason = before.reason
    try:
        client.resume(node)
        result = _run_guarded(client, name, node, argv, timeout_s=timeout_s, drained_reason=reason)
        reason = v.reason("verdict", verdict if isinstance(verdict, str) else verdict(result), ours=True)
        return result
    finally:
        try:
            client.drain(node, reason)
        finally:
            _delete_reservation(client, name)


#: How often the reservation that keeps a resumed suspect node to itself is checked while the diagnostic runs.
RESERVATION_GUARD_S = 5.0


def _run_guarded(
    client: SlurmClient,
    name: str,
    node: str,
    argv: tuple[str, ...],
    *,
    timeout_s: float,
    drained_reason: str,
) -> CommandResult:
    """run_in_reservation, while checking that the reservation still exists. slurmctld can lose a reservation
    it had not saved yet (a SIGKILL right after its creation: "Recovered state of 0 reservations"); the
    resumed suspect node would then take any job. Once the reservation is gone the node is drained again at
    once with its old reason (a drain never stops the running step), not when the diagnostic ends."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="longrun-diag") as pool:
        run = pool.submit(client.run_in_reservation, name, node, argv, timeout_s=timeout_s)
        guarded = True
        while True:
            try:
                return run.result(timeout=RESERVATION_GUARD_S)
            except FutureTimeout:
                pass
            if not guarded:
                continue
            try:
                if name in client.reservations():
                    continue
                client.drain(node, drained_reason)
            except SlurmError:  # slurmctld away for a moment: look again at the next tick
                continue
            guarded = False
            log.error(
                "reservation %s vanished while the diagnostic ran on %s: drained it again (%s)",
                name,
                node,
                drained_reason,
            )


def _delete_reservation(client: SlurmClient, name: str) -> None:
    """Delete the reservation; one that is already gone (lost by slurmctld) is not an error."""
    try:
        client.delete_reservation(name)
    except SlurmError:
        if name in client.reservations():
            raise
        log.warning("reservation %s was already gone", name)
