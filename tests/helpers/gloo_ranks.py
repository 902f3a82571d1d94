"""Real gloo ranks for the sharded tests: W spawned processes on this host, one process group, each rank's
findings written as JSON and read back by the test.

    results = spawn_ranks(worker, 6, tmp_path, *more_args)   # worker(rank, world, port, out, *more_args)

Inside the worker, `join_group(rank, world, port)` sets the variables a launcher would (RANK, WORLD_SIZE,
MASTER_ADDR/PORT, one thread) and joins the group; `write_result(out, rank, obj)` leaves the rank's JSON.
`small_model(seed)` is the model these tests shard: two linear layers, seeded, the same on every rank.
A worker that raises makes `spawn_ranks` raise (torch.multiprocessing joins every process and re-raises
the first failure), so a test never passes on a rank that died.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_ranks(worker: Callable[..., None], world: int, out: Path, *args: Any) -> list[Any]:
    """Run `worker(rank, world, port, str(out), *args)` on `world` spawned ranks; every rank's JSON result."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    port = free_port()
    mp.set_forkserver_preload(["torch", "torch.distributed", "helpers.gloo_ranks"])
    mp.start_processes(
        worker, args=(world, port, str(out), *args), nprocs=world, join=True, start_method="forkserver"
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def join_group(rank: int, world: int, port: int) -> None:
    """This process's environment as a launcher sets it, then the gloo process group."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    dist.init_process_group("gloo", rank=rank, world_size=world)


def write_result(out: str, rank: int, result: Any) -> None:
    Path(out, f"rank{rank}.json").write_text(json.dumps(result, sort_keys=True))


def small_model(seed: int) -> nn.Sequential:
    """Linear(8, 12), ReLU, Linear(12, 6), initialised from `seed`."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 6))
