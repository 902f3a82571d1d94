"""A warm standby for the next attempt inside a job that keeps its allocation (hot spares).

Starting a training step costs seconds that have nothing to do with the incident: srun, ft_launcher's and
the trainer's torch imports, the rendezvous, the process group. The supervisor (training.spares.supervisor)
therefore starts the next attempt's step as soon as the running step's alert is in the store (`AlertWatch`;
the alerting step is still ending then: the standby's step overlaps it), on the nodes the directive will
most likely name (the allocation minus the alert's suspect nodes and earlier exclusions:
`predicted_nodes`). That step's trainer (`--await-directive-s`) gets as far as the process group, then
waits for the orchestrator's directive (`await_directive`) before it connects to NVRx's monitor, loads
anything or writes any record; the directive comes only once the alerting step has ended:

- the directive names exactly this step's nodes and passes the supervisor's checks: it resumes from the
  directed checkpoint and trains, seconds after the directive instead of a whole start-up after it;
- it names other nodes or is refused: it never trains; the supervisor stops it (and starts a fresh step
  on the directed nodes, or exits 93);
- no directive in time: it never trains; the supervisor stops it and exits 93.

Only the directive decides where and from what the attempt trains: a wrong prediction costs the start-up
it tried to save, never a step on the wrong node. Rank 0 alone reads the store; the other ranks learn its
answer through one small broadcast per poll, so no collective waits longer than a poll.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterable, Sequence

import torch.distributed as dist

from training.config import GuardConfig
from training.launch_records import LAUNCH_T0_ENV
from training.records import schema, signing
from training.records.alert import AlertRef
from training.spares.directive import directed_nodes, read_directive
from training.store.factory import store_from_env
from training.store.interface import ObjectStore, StoreError, StoreUnavailable, get_json

log = logging.getLogger("training.standby")

#: How often rank 0 looks for the directive (the supervisor polls at its own interval beside it).
POLL_S = 0.2
_WAIT, _TIMEOUT, _NOT_MINE = "", "\0timeout", "\0not-mine"


class NotDirected(RuntimeError):
    """The standby's wait ended without a directive for its nodes: it must not train."""


def directed(cfg: GuardConfig, *, rank: int, nodes: Sequence[str]) -> GuardConfig:
    """`cfg` resuming from the directed checkpoint, once the directive for this job's attempt
    (SLURM_JOB_ID, LONGRUN_ATTEMPT) names exactly `nodes`; NotDirected otherwise."""
    job_id, attempt = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("LONGRUN_ATTEMPT", "")
    if not job_id.isdigit() or not attempt.isdigit() or int(attempt) < 1:
        raise NotDirected(
            f"a standby needs SLURM_JOB_ID and LONGRUN_ATTEMPT >= 1, got {job_id!r}, {attempt!r}"
        )
    store = None
    if rank == 0 and cfg.use_store:  # without a store rank 0 never answers: every rank waits out wait_s
        try:
            store = store_from_env()
        except StoreError as e:
            log.error("standby: no store to read the directive from (%s)", e)
    resume = await_directive(
        store, run=cfg.run, job_id=job_id, attempt=int(attempt), nodes=nodes, wait_s=cfg.await_directive_s,
        rank=rank,
    )  # fmt: skip
    if resume is None:
        raise NotDirected(f"no directive for job {job_id} attempt {attempt} on {sorted(set(nodes))} "
                          f"within {cfg.await_directive_s:g} s: the supervisor runs the attempt elsewhere")  # fmt: skip
    if store is not None:
        _launch_starts_at_directive(store, run=cfg.run, job_id=job_id, attempt=int(attempt))
    return dataclasses.replace(cfg, resume_from=resume, await_directive_s=0.0)


def _launch_starts_at_directive(store: ObjectStore, *, run: str, job_id: str, attempt: int) -> None:
    """Rank 0 (which decides an in-job restart's resume and verdict): this launch's records begin at the
    directive, not at the step's start. The standby started while the previous attempt's step was still
    ending (its last checkpoint upload, its segment record); the directive comes only once that step has
    ended (longrun.incident.hot_spare), so nothing of it is newer than the directive's `issued_at`. Without
    this an in-job restart could resume from the previous attempt's newest checkpoint, not the directed one.
    Every incarnation of the launch reads the same directive, so every one sets the same time."""
    d = read_directive(store, run=run, job_id=job_id, attempt=attempt)
    if d is None:  # written once and never removed: cannot happen after the answer above; fail loud
        raise NotDirected(f"the directive of job {job_id} attempt {attempt} disappeared")
    since = float(os.environ.get(LAUNCH_T0_ENV) or 0.0)
    os.environ[LAUNCH_T0_ENV] = f"{max(since, d.issued_at):.9f}"


class AlertWatch:
    """The suspect nodes of the run's alerts raised at or after `since` (epoch s), looked up incrementally:
    one listing per look, each readable alert read once. The supervisor looks every poll while a step runs,
    so the next attempt's standby starts at the step's alert, not at its end. Only this job's alerts count
    (`signing.alert_not_mine`; `job`: this job's key and id, by default from the environment): a forged
    one would start a standby on a forged prediction."""

    def __init__(
        self, store: ObjectStore, run: str, since: float, *, job: signing.ThisJob | None = None
    ) -> None:
        self.store, self.run, self.since = store, run, since
        self.prefix = schema.store_key(run, "alerts/")
        self.job = signing.ThisJob.from_env() if job is None else job
        self._read: dict[str, frozenset[str]] = {}  # alert key -> its suspects (empty: not counted)

    def suspects(self) -> set[str]:
        """StoreError when the listing fails; an unreadable alert is skipped (and read again next look)."""
        for info in self.store.list(self.prefix):
            if not info.key.endswith(".json") or info.key in self._read:
                continue
            try:
                raw = get_json(self.store, info.key)
            except (StoreError, ValueError):
                continue  # unreadable: a prediction only, the directive decides
            alert = AlertRef.from_json(raw)
            recent = alert.time is not None and alert.time >= self.since
            why = signing.alert_not_mine(raw, job=self.job, run=self.run) if recent else None
            if why is not None:
                log.warning("alert %s is not this job's (%s): no standby for it", info.key, why)
            self._read[info.key] = frozenset(alert.suspect_nodes) if recent and why is None else frozenset()
        return set().union(*self._read.values())


def predicted_nodes(held: Sequence[str], excluded: Iterable[str], width: int) -> list[str] | None:
    """The nodes the directive will most likely name: as the orchestrator chooses them (the job's nodes in
    allocation order, without the excluded ones, the first `width`), or None when too few are left."""
    keep = directed_nodes(held, excluded)
    return keep[:width] if len(keep) >= width else None


def _answer(store: ObjectStore, *, run: str, job_id: str, attempt: int, nodes: list[str]) -> str:
    """Rank 0's reading of the directive now: _WAIT, _NOT_MINE, or the checkpoint to resume from."""
    try:
        d = read_directive(store, run=run, job_id=job_id, attempt=attempt)
    except StoreUnavailable as e:  # an outage is not a refusal: look again until the wait runs out
        log.warning("standby: store unavailable, still waiting for the directive (%s)", e)
        return _WAIT
    except (StoreError, ValueError) as e:
        log.error("standby: directive unusable (%s): not training", e)
        return _NOT_MINE
    if d is None:
        return _WAIT
    why = d.refusal(run=run, job_id=job_id, attempt=attempt, allocation=nodes, width=len(nodes))
    if why:  # the supervisor stops this step; until then it must not train
        log.warning("standby: not directed here (%s): waiting to be stopped", why)
        return _NOT_MINE
    log.info("standby: directed by incident %s, resuming from %s", d.incident_id, d.resume_from)
    return d.resume_from


def _broadcast(value: str) -> str:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box: list[object] = [value]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def await_directive(
    store: ObjectStore | None,
    *,
    run: str,
    job_id: str,
    attempt: int,
    nodes: Sequence[str],
    wait_s: float,
    rank: int,
    poll_s: float = POLL_S,
) -> str | None:
    """Every rank: the checkpoint the directive for (`run`, `job_id`, `attempt`) resumes from, when it
    names exactly this step's `nodes` (one per rank, in rank order); None when none came within `wait_s`
    or it names other nodes (then after waiting out `wait_s`: the supervisor stops the step first).
    Rank 0 needs the store; the others may pass None."""
    mine = list(dict.fromkeys(nodes))
    deadline = time.monotonic() + wait_s
    if rank == 0:
        log.info("standby: waiting up to %g s for the directive of job %s attempt %d on %s",
                 wait_s, job_id, attempt, ",".join(mine))  # fmt: skip
    verdict = _WAIT
    while True:
        state = _WAIT
        if rank == 0:
            if verdict == _WAIT and store is not None:
                verdict = _answer(store, run=run, job_id=job_id, attempt=attempt, nodes=mine)
            if verdict not in (_WAIT, _NOT_MINE):
                state = verdict
            elif time.monotonic() >= deadline:
                state = _TIMEOUT
        state = _broadcast(state)
        if state == _TIMEOUT:
            return None
        if state != _WAIT:
            return state
        if rank == 0:
            time.sleep(poll_s)
