"""In-process restart with NVRx's `inprocess.Wrapper`, in the one shape that works with gloo on CPU.

Optional and off by default (the reference trainer does not use it; see docs/nvrx.md). What it is for:
a rank's Python exception (a transient error, a failed collective) restarts the training function on
every rank inside the same processes, without ft_launcher tearing the workers down and re-importing
torch (~4 s here instead of ~20 s).

Why this shape (NVRx 0.4.1, measured here):
- The process-group store is created ONCE, outside the wrapper, on MASTER_PORT + `store_port_offset`
  (the wrapper's own store takes MASTER_PORT). Each restart iteration uses its own key prefix on it,
  so a new process group never reads the keys of the dead one.
- The gloo timeout is short (`gloo_timeout_s`): NVRx's abort only aborts NCCL, so the healthy ranks
  leave a broken collective only when gloo times out; the restart latency is about that timeout.
- An SDC verdict is NOT restarted in place: `SystemExit` (the trainer's exit 93) passes through the
  wrapper untouched, on every rank, and the process exits 93 as without the wrapper.
- A rank that dies (SIGKILL) cannot be restarted in its own process: the wrapper would go on with the
  survivors (a smaller world, other bits). That case belongs to ft_launcher, which restarts the workers.
- NVRx 0.7 adds NVML GPU health checks when LOCAL_RANK is set; they fail without a GPU, so on CPU this
  refuses to run under 0.7+ (`Capabilities.nvml_health_checks`).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from training.nvrx.adapter import capabilities

T = TypeVar("T")
ENABLE_ENV = "LONGRUN_INPROCESS_RESTART"


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


@dataclass(frozen=True, kw_only=True, slots=True)
class InprocessSettings:
    """Timeouts of the wrapper; NVRx requires soft < hard < barrier and heartbeat < barrier."""

    max_iterations: int = 3
    """Restarts allowed in-process (iteration 0 is the first run)."""
    gloo_timeout_s: float = 3.0
    """Collective timeout of each iteration's process group: the restart latency on gloo."""
    store_port_offset: int = 1
    """The process-group store listens on MASTER_PORT + this (the wrapper's store has MASTER_PORT)."""
    soft_timeout_s: float = 60.0
    """No progress (`ping`) for this long: the rank aborts and restarts with the others."""
    hard_timeout_s: float = 90.0
    """No progress for this long: the rank is terminated."""
    heartbeat_timeout_s: float = 30.0
    """A rank whose monitor is silent this long is treated as gone."""
    barrier_timeout_s: float = 120.0
    """Barriers between iterations."""
    monitor_log: str | None = None
    """Absolute path of NVRx's monitor process log ("{rank}" is filled in), or None."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_iterations, bool)
            or not isinstance(self.max_iterations, int)
            or self.max_iterations < 1
        ):
            raise ValueError(f"max_iterations must be an integer >= 1, got {self.max_iterations!r}")
        for name in (
            "gloo_timeout_s",
            "soft_timeout_s",
            "hard_timeout_s",
            "heartbeat_timeout_s",
            "barrier_timeout_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not self.soft_timeout_s < self.hard_timeout_s < self.barrier_timeout_s:
            raise ValueError(
                f"need soft_timeout_s < hard_timeout_s < barrier_timeout_s, got "
                f"{self.soft_timeout_s}, {self.hard_timeout_s}, {self.barrier_timeout_s}"
            )
        if self.heartbeat_timeout_s >= self.barrier_timeout_s:
            raise ValueError(
                f"heartbeat_timeout_s={self.heartbeat_timeout_s} must be below barrier_timeout_s={self.barrier_timeout_s}"
            )
        if not 1 <= self.store_port_offset <= 1000:
            raise ValueError(f"store_port_offset must be in 1..1000, got {self.store_port_offset!r}")
        if self.monitor_log is not None and not os.path.isabs(self.monitor_log):
            raise ValueError(f"monitor_log must be an absolute path, got {self.monitor_log!r}")


def enabled(env: dict[str, str] | None = None) -> bool:
    """Opt-in: LONGRUN_INPROCESS_RESTART=1."""
    env = dict(os.environ if env is None else env)
    return env.get(ENABLE_ENV) == "1"


class Attempt:
    """One iteration of the wrapped function: its number, its process group, its progress ping."""

    def __init__(self, *, iteration: int, store: Any, settings: InprocessSettings, call_wrapper: Any) -> None:
        self.iteration = iteration
        self._store, self._settings, self._cw = store, settings, call_wrapper

    def init_process_group(self) -> None:
        """The default gloo group of this iteration, on a key prefix of its own."""
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"longrun/inprocess/{self.iteration}", self._store),
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=_td(self._settings.gloo_timeout_s),
        )

    def ping(self) -> None:
        """Report progress (call once per step): silence longer than soft_timeout_s restarts."""
        self._cw.ping()


def run(fn: Callable[[Attempt], T], settings: InprocessSettings | None = None) -> T:
    """Run `fn(attempt)` under NVRx's in-process restart. Needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    (torchrun / ft_launcher / the job script set them) and no process group yet."""
    settings = settings or InprocessSettings()
    caps = capabilities()
    if caps.nvml_health_checks and os.environ.get("LOCAL_RANK") is not None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                f"NVRx {caps.version}: inprocess.Wrapper runs NVML GPU health checks when LOCAL_RANK is set, "
                "which fail without a GPU; use ft_launcher restarts on CPU"
            )
    import torch.distributed as dist
    from nvidia_resiliency_ext import inprocess

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Created once, outside the wrapper: a store made inside would die with the iteration that failed.
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]) + settings.store_port_offset,
        world,
        rank == 0,
        timeout=_td(settings.barrier_timeout_s),
        wait_for_workers=True,
    )

    def attempt_fn(call_wrapper: Any = None) -> T:
        attempt = Attempt(
            iteration=call_wrapper.iteration, store=store, settings=settings, call_wrapper=call_wrapper
        )
        result = fn(attempt)
        # After a failure NVRx's abort tears the group down; after a success it is ours to close
        # (a barrier first: a gloo teardown without one was seen to deadlock).
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
        return result

    # NVRx finds the parameter to fill by its annotation, read as a class: this module's postponed
    # (string) annotations would not match, so give it the class itself.
    attempt_fn.__annotations__ = {"call_wrapper": inprocess.CallWrapper}
    wrapped = inprocess.Wrapper(
        initialize=inprocess.initialize.RetryController(max_iterations=settings.max_iterations),
        soft_timeout=_td(settings.soft_timeout_s),
        hard_timeout=_td(settings.hard_timeout_s),
        heartbeat_timeout=_td(settings.heartbeat_timeout_s),
        barrier_timeout=_td(settings.barrier_timeout_s),
        completion_timeout=_td(settings.barrier_timeout_s),
        monitor_process_logfile=settings.monitor_log,
    )(attempt_fn)
    return wrapped()
