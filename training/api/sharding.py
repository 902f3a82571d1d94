"""What the guard does differently for a sharded model (FSDP2 over one mesh dimension, HSDP over two), on
every rank: `Guard.prepare_sharded` and its step use these parts.

- The mesh: `("shard",)` is FSDP2 (every rank holds a different shard, nothing is replicated);
  `("replicate", "shard")` is HSDP (the ranks along "replicate" hold the same shard). `fully_shard(model,
  mesh=mesh)` is applied to the root module (a user who wants per-layer groups calls `fully_shard` on the
  layers first, with the same mesh; the root is then sharded last, as FSDP2 asks).
- The checks (`sharded_checks`): the finite check runs on the gradient shards after the reduce-scatter
  (training.checks.finite.ShardedFiniteCheck), the weight vote within the ranks that hold the same shard
  (ReplicaLayout.from_mesh), the recompute with every rank at once (RecomputeCheck.for_sharded: rank r
  recomputes rank (r + k)'s micro-batch, forward and backward, k the smallest offset onto another node, so
  the collectives of every shard group line up; one rank recomputing alone would hang its group). It
  compares the loss and the local gradient, which the guard sees where FSDP reduce-scatters it
  (training.api.sharded_gradients), or the loss alone where it cannot. It runs on FSDP2 too: it needs no
  replica, only that every rank gathers the same full weights, which FSDP2's all-gather gives. One
  configuration is refused, not weakened in silence: a weight vote over a layout that is not votable
  (FSDP2: no shard is held by two ranks). A vote that compares nothing would pass at every step and look
  like protection; dropping it with a warning would leave the records of a run that claims a check it
  never ran. The fix is the user's choice, so the error names both: replicate the shards (an HSDP mesh) or leave `weight_vote` out of `CheckConfig.checks`.
- The gradient (`local_grads`, `nonfinite`): the finite check and the drills look after backward at what
  the rank holds, its shard of the reduced gradient (the tap above only fingerprints, at audit steps). The
  gradient drills (`nan`, `inf`, `scale`: training.faults) change one element of the largest such shard,
  on the target rank: a fault after the reduction, on one replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from training.checks.base import Check
from training.checks.finite import ShardedFiniteCheck
from training.checks.recompute import RecomputeCheck
from training.checks.replicas import REPLICATE, ReplicaLayout
from training.checks.weight_vote import WeightVoteCheck
from training.faults import Injector
from training.fingerprint.host import local_part

SHARD = "shard"
MESHES = ((SHARD,), (REPLICATE, SHARD))


def mesh_for(parallelism: str, *, nodes: Sequence[str], device_type: str) -> Any:
    """The DeviceMesh of `parallelism` (training.config.PARALLELISMS) over a world whose rank r runs on
    `nodes[r]`: None for `ddp`; `("shard",)` over every rank for `fsdp`; for `hsdp` `("replicate", "shard")`
    with one row per node, so a shard's all-gathers stay inside a node and each shard's replicas sit on
    different nodes (a sick node then disagrees with healthy replicas of every shard it holds, and the vote
    names it). Every rank calls it (DeviceMesh creates process groups). ValueError: an unknown parallelism,
    `hsdp` on one node, nodes with unequal rank counts, or a node whose ranks are not contiguous (the launcher
    numbers a node's ranks one after another; anything else is not the layout this mesh assumes)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = len(nodes)
    if parallelism == "ddp":
        return None
    if parallelism == "fsdp":
        return init_device_mesh(device_type, (world,), mesh_dim_names=(SHARD,))
    if parallelism != "hsdp":
        raise ValueError(f"parallelism {parallelism!r} is not one of ddp, fsdp, hsdp")
    hosts = list(dict.fromkeys(nodes))
    per_node = world // len(hosts)
    rows = [list(nodes[i * per_node : (i + 1) * per_node]) for i in range(len(hosts))]
    if len(hosts) < 2:
        raise ValueError("hsdp replicates across nodes: it needs 2 nodes or more (use fsdp on one node)")
    if per_node * len(hosts) != world or any(len(set(row)) != 1 for row in rows):
        counts = {h: nodes.count(h) for h in hosts}
        raise ValueError(
            f"hsdp needs the same number of ranks on every node, numbered one node after another; the ranks"
            f" sit on {counts} in the order {list(nodes)}"
        )
    return init_device_mesh(device_type, (len(hosts), per_node), mesh_dim_names=(REPLICATE, SHARD))


def mesh_layout(mesh: Any, world: int) -> ReplicaLayout:
    """The replica layout of a mesh the guard can shard over; ValueError naming the accepted meshes."""
    names = tuple(mesh.mesh_dim_names or ())
    if names not in MESHES:
        raise ValueError(
            f"the DeviceMesh's dimensions are {names}; the guard shards over ('shard',) (FSDP2) or "
            "('replicate', 'shard') (HSDP): init_device_mesh(..., mesh_dim_names=...)"
        )
    if mesh.size() != world:
        raise ValueError(f"the DeviceMesh spans {mesh.size()} ranks, the world has {world}: it must span all")
    return ReplicaLayout.from_mesh(mesh, replicate=[n for n in names if n == REPLICATE])


def sharded_checks(checks: Sequence[Check], layout: ReplicaLayout, *, gradients: bool) -> list[Check]:
    """The checks of a sharded run, in the same order: see the module docstring for what is refused
    (ValueError) and why. `gradients`: the guard sees the local gradient (training.api.sharded_gradients),
    so the recompute compares it beside the loss."""
    out: list[Check] = []
    for c in checks:
        if isinstance(c, RecomputeCheck):
            out.append(c.for_sharded(gradients=gradients))
        elif c.name == "finite":
            out.append(ShardedFiniteCheck(layout=layout))
        elif isinstance(c, WeightVoteCheck):
            if not layout.votable:
                raise ValueError(
                    f"the weight vote needs two ranks holding each shard; the mesh is {layout.describe()} "
                    "(FSDP2, nothing replicated). Replicate the shards (an HSDP mesh with a 'replicate' "
                    "dimension of 3 or more, to name a rank) or leave 'weight_vote' out of CheckConfig.checks"
                )
            out.append(WeightVoteCheck(every=c.every, algorithm=c.algorithm, layout=layout))
        else:
            out.append(c)
    return out


def shard(model: nn.Module, mesh: Any) -> nn.Module:
    """`fully_shard` the root over `mesh` (HSDP on a 2-D mesh), unless the caller already did."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if not isinstance(model, FSDPModule):
        fully_shard(model, mesh=mesh)
    return model


def local_grads(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's shard of each reduced gradient (zeros for a parameter without a gradient)."""
    return [
        local_part(p.grad) if p.grad is not None else torch.zeros_like(local_part(p.detach())) for p in params
    ]


def local_params(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's shard of each parameter, sharing its storage (a weight-flip drill changes the weights)."""
    return [local_part(p.detach()) for p in params]


def gradient_drills(injector: Injector, step: int, grads: Sequence[torch.Tensor]) -> None:
    """`nan`, `inf`, `scale` on one element of this rank's largest gradient shard, in place."""
    largest = max(grads, key=lambda g: g.numel())
    if largest.numel():
        injector.local_gradients(step, largest.view(-1))


def clip_gradients(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale every gradient shard by `max_norm / (norm + 1e-6)` when that is below 1, where `norm` is the
    2-norm of the whole model's reduced gradient: the DDP path's rule (`Guard._train_step`), so a run clips
    alike under either. The norm is taken on the gradients as DTensors, which reduce each parameter's norm
    over the ranks holding its shards (a replicated mesh dimension counted once), and `full_tensor()` gives
    every rank the same value, so every rank scales by the same coefficient. Returns that norm."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    coef = max_norm / (total + 1e-6)
    if float(coef) < 1.0:
        for g in local_grads(params):
            g.mul_(coef.to(g.device, g.dtype))
    return total


def nonfinite(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """A bool scalar: some element of this rank's gradient shards is NaN or Inf (one sum per shard, as the
    DDP hook does per bucket)."""
    flag = torch.tensor(False)
    for g in grads:
        if g.numel():
            flag = flag | ~torch.isfinite(g.sum()).cpu()
    return flag


def mean_loss(loss: torch.Tensor, world: int) -> float:
    """The step's mean loss over the world: one all-reduce of one float64."""
    total = loss.detach().reshape(1).to(torch.float64)
    if world > 1:
        dist.all_reduce(total)
    return float(total.item()) / world
