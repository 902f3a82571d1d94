"""Who am I in the job: rank, world, local rank and node name, from torchrun/ft_launcher or Slurm; and the
process group (gloo on CPU, NCCL where CUDA is present)."""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from training import ports


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where this process sits in the job."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of ranks."""
    local_rank: int
    """Rank on this node."""
    node: str
    """Node name (SLURMD_NODENAME, else LONGRUN_NODE_NAMES[rank], else the host name)."""

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} is not in a world of size {self.world_size}")
        if self.local_rank < 0:
            raise ValueError(f"local_rank must be >= 0, got {self.local_rank}")
        if not self.node:
            raise ValueError("node name is empty")


def _int(env: dict[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"environment variable {name}={env[name]!r} is not an integer") from None


def placement_from_env(env: dict[str, str] | None = None) -> Placement:
    """torchrun / ft_launcher variables (RANK, WORLD_SIZE, LOCAL_RANK) win; else Slurm's (SLURM_PROCID,
    SLURM_NTASKS, SLURM_LOCALID); else a single process."""
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
    else:
        rank, world, local = 0, 1, 0
    return Placement(rank=rank, world_size=world, local_rank=local, node=node_name(rank, env))


def node_name(rank: int, env: dict[str, str] | None = None) -> str:
    env = dict(os.environ if env is None else env)
    if env.get("SLURMD_NODENAME"):
        return env["SLURMD_NODENAME"]
    names = [n.strip() for n in env.get("LONGRUN_NODE_NAMES", "").split(",") if n.strip()]
    if names:
        if rank >= len(names):
            raise ValueError(f"LONGRUN_NODE_NAMES names {len(names)} nodes but this is rank {rank}")
        return names[rank]
    return socket.gethostname()


def _default_port(env: dict[str, str]) -> str:
    # Under srun without a launcher, derive a port from the job id so two jobs on a node do not collide:
    # the launch script's rule and default range (training.ports).
    job = env.get("SLURM_JOB_ID", "")
    return str(ports.rendezvous_port(int(job))) if job.isdigit() else "29500"


def init_process_group(placement: Placement, *, timeout_s: float, claim_device: bool = True) -> str:
    """Start the default process group and return the backend used. MASTER_ADDR defaults to 127.0.0.1
    (the job script sets it on a real cluster), MASTER_PORT to one derived from the Slurm job id.

    `claim_device=False` (a warm standby, training.spares.standby): where CUDA is present, the group is
    "cpu:gloo,cuda:nccl" and no device is touched yet: the standby starts beside the alerting step, whose
    processes still hold the GPUs (exclusive-process mode refuses a second context). Its CPU objects
    (the node names, the directive's answer) go through gloo; `use_rank_device` after the directive, and
    NCCL's communicator starts with the first CUDA collective. Without CUDA both are plain gloo."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", _default_port(dict(os.environ)))
    backend = process_group_backend(cuda=torch.cuda.is_available(), claim_device=claim_device)
    if backend == "nccl":
        use_rank_device(placement)
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=placement.rank,
        world_size=placement.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return backend


def process_group_backend(*, cuda: bool, claim_device: bool) -> str:
    """gloo without CUDA; NCCL with it; gloo for CPU objects and NCCL for CUDA tensors where the device
    must not be touched yet (a standby: see init_process_group)."""
    if not cuda:
        return "gloo"
    return "nccl" if claim_device else "cpu:gloo,cuda:nccl"


def use_rank_device(placement: Placement) -> None:
    """Make this rank's GPU (local rank modulo the node's count) the current device; nothing without CUDA."""
    if torch.cuda.is_available():
        torch.cuda.set_device(placement.local_rank % torch.cuda.device_count())


def device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


def gather_strings(value: str) -> list[str]:
    """Every rank's string, in rank order (once at start-up; too slow for the step loop)."""
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return [str(v) for v in out]


def all_gather_int64(values: list[int], dev: torch.device) -> torch.Tensor:
    """Gather a fixed-length int64 vector from every rank: a (world, len) tensor on the CPU."""
    t = torch.tensor(values, dtype=torch.int64, device=dev)
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return torch.stack(parts).cpu()


def shutdown() -> None:
    """Barrier, then destroy the group (a barrier first avoids a teardown deadlock seen with gloo)."""
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
