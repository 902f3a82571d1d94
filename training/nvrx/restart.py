"""What an in-job restart (ft_launcher) changes for the trainer: the drills it drops, where it resumes."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.launch_records import LAUNCH_T0_ENV, alerts_since, newest_checkpoint_since

log = logging.getLogger("training.nvrx")  # the adapter's logger, as before the split

#: Fault kinds that would fire again after every restart (the restarted run replays the step).
ONE_SHOT_FAULTS = ("crash", "hang")


def first_incarnation_only(faults: tuple[Any, ...], restart_count: int) -> tuple[Any, ...]:
    """Drop crash/hang drills after an in-job restart: the resumed run replays the fault's step, and a
    drill that fired again would burn the whole restart budget. (`LONGRUN_FAULTS_EVERY_RESTART=1` keeps
    them, to rehearse a job that keeps crashing.)"""
    if restart_count == 0 or os.environ.get("LONGRUN_FAULTS_EVERY_RESTART") == "1":
        return faults
    kept = tuple(f for f in faults if f.kind not in ONE_SHOT_FAULTS)
    if len(kept) != len(faults):
        log.warning(
            "in-job restart %d: crash/hang drills already fired, not injecting them again", restart_count
        )
    return kept


def in_job_resume_ref(
    *, restart_count: int, default: str | None, run_dir: Path, run: str, store: Any = None
) -> str | None:
    """Where this incarnation resumes. The first one: `default` (the launch's --resume-from). After an
    ft_launcher restart: the newest checkpoint this launch wrote, else `default` again. Rank 0 decides and
    broadcasts, so every rank loads the same step even if they see the file system differently."""
    if restart_count == 0:
        return default

    def choose() -> str | None:
        since = float(os.environ.get(LAUNCH_T0_ENV) or 0.0)
        choice = newest_checkpoint_since(run_dir, since, run=run, store=store) or default
        log.warning("in-job restart %d: resuming from %s", restart_count, choice or "scratch")
        return choice

    return _decided_by_rank0(choose)


def verdict_already_given(*, restart_count: int, run_dir: Path, run: str, store: Any = None) -> str | None:
    """After an ft_launcher restart: an alert this launch already wrote, else None. NVRx 0.4.1 can restart
    the workers before the verdict's shutdown request reaches it; the restarted run would then train on
    the suspect node again (and a drill would fire twice). Such an incarnation exits 93 before its first
    step. Without the launch's start time (`LONGRUN_LAUNCH_T0`) nothing can tell this launch's alerts from
    an earlier attempt's, so it never decides. Rank 0 decides and broadcasts, as for the resume."""
    raw = os.environ.get(LAUNCH_T0_ENV)
    if restart_count == 0 or not raw:
        return None

    def first_alert() -> str | None:
        alerts = alerts_since(run_dir, float(raw), run=run, store=store)
        return alerts[0] if alerts else None

    return _decided_by_rank0(first_alert)


def _decided_by_rank0(decide: Callable[[], str | None]) -> str | None:
    """`decide()` on rank 0, broadcast to every rank: all ranks act alike even where they see the file
    system differently."""
    import torch.distributed as dist

    value: list[str | None] = [None]
    if not dist.is_initialized() or dist.get_rank() == 0:
        value[0] = decide()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(value, src=0)
    return value[0]
