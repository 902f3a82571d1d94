"""What a checkpoint carries besides the weights and the optimizer: the user's stateful objects and RNG.

Two kinds of state:

- run state, the same on every rank: the LR scheduler. Saved once (rank 0's copy).
- rank state, one per rank: every object the user hands the guard under `state=` (a data loader, a
  sampler, anything with `state_dict()` / `load_state_dict()`) and the rank's random generators (torch's
  CPU and CUDA generators, Python's `random`, NumPy's global generator). Gathered to rank 0 at each save
  (`gather_object`: one collective per save, never per step) and restored on the same rank on resume.
  A checkpoint taken with W ranks resumes only on W ranks (a relaunch keeps the world size; a hot spare
  replaces a node, it does not remove one): anything else is refused with the two sizes.

The randomness inside a step does not depend on any of this: `StepRng` forks the generators for each
step's forward pass and seeds them from (seed, step, rank), so the real pass, its recompute on another
rank and a resumed run all draw the same dropout masks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
import torch.distributed as dist
import xxhash

T = TypeVar("T")


@runtime_checkable
class Stateful(Protocol):
    """Anything that can say and take back its state (torch's optimizers, schedulers, StatefulDataLoader)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class StateError(ValueError):
    """A checkpoint's extra state does not fit this job (another world size, missing objects)."""


def step_seed(seed: int, step: int, rank: int) -> int:
    """A 63-bit seed for the forward pass of (step, rank): neighbouring pairs unrelated."""
    return xxhash.xxh3_64_intdigest(f"longrun-step:{seed}:{step}:{rank}".encode()) >> 1


class StepRng:
    """Runs a function under torch's generators forked and seeded from (seed, step, rank); the
    generators outside are left as they were."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.seed = seed
        self.devices = [device] if device.type == "cuda" else []

    def __call__(self, step: int, rank: int, fn: Callable[[], T]) -> T:
        with self.fork(step, rank):
            return fn()

    @contextmanager
    def fork(self, step: int, rank: int) -> Iterator[None]:
        with torch.random.fork_rng(devices=self.devices):
            torch.manual_seed(step_seed(self.seed, step, rank))
            yield


def rng_state() -> dict[str, Any]:
    """This process's generators, in a form `torch.load(weights_only=True)` reads back."""
    out: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    version, internal, gauss = random.getstate()
    out["python"] = [version, list(internal), gauss]
    try:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
        keys_i64 = np.asarray(keys).astype("int64")
        out["numpy"] = [str(name), torch.from_numpy(keys_i64), int(pos), int(has_gauss), float(cached)]
    except ImportError:
        pass
    return out


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))


def rank_state(objects: Mapping[str, Stateful]) -> dict[str, Any]:
    """This rank's part of a checkpoint."""
    return {"rng": rng_state(), "objects": {name: obj.state_dict() for name, obj in objects.items()}}


def gather_rank_states(mine: dict[str, Any], *, rank: int, world: int) -> list[dict[str, Any]] | None:
    """Every rank's part, on rank 0 (None elsewhere). A collective: every rank calls it at each save."""
    if world == 1 or not dist.is_initialized():
        return [mine]
    out: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(mine, out, dst=0)
    return out


def restore_rank_state(
    ranks: Any, objects: Mapping[str, Stateful], *, rank: int, world: int, where: str
) -> None:
    """Load this rank's part of a checkpoint into `objects` and the generators."""
    if not isinstance(ranks, list) or len(ranks) != world:
        have = len(ranks) if isinstance(ranks, list) else "no"
        raise StateError(
            f"{where} holds per-rank state for {have} ranks, this job has {world}: resume it on the same "
            "number of ranks (a relaunch keeps the world size)"
        )
    mine = ranks[rank]
    saved = mine.get("objects", {})
    missing = sorted(set(objects) - set(saved))
    if missing:
        raise StateError(f"{where} has no state for {missing}; it has {sorted(saved)}")
    for name, obj in objects.items():
        obj.load_state_dict(saved[name])
    set_rng_state(mine["rng"])
