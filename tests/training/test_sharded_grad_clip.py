"""`grad_clip` on a sharded model: the whole model's gradient norm, as under DDP, on real FSDP2 and HSDP.

Four real gloo ranks (CPU; nothing mocked) train two steps through `Guard.prepare_sharded` and `Guard.run`
with plain SGD and a `grad_clip` far below the gradient's norm, once on a ("shard",) mesh of 4 (FSDP2) and
once on a ("replicate", "shard") mesh of 2 x 2 (HSDP). The reference is computed in the test process
without any process group: the same model on every rank's micro-batch, the gradient averaged over the
ranks (what the reduce-scatter and the replica all-reduce give), clipped by `Guard._train_step`'s rule
(scale by clip / (norm + 1e-6) when that is below 1), one SGD step. Each sharded run must end on the
reference's weights (to float rounding: the reduction order differs), and on different ones than the same
run without clipping: a clip that did nothing, or clipped each shard by its own norm, or counted a
replicated shard twice, would end elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.gloo_ranks import join_group, small_model, spawn_ranks, write_result

WORLD = 4
STEPS = 2
CLIP = 0.05
LR = 0.5


def _batch(rank: int, i: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1000 * i + rank))


class Batches:
    def __init__(self, rank: int) -> None:
        self.rank, self.i = rank, 0

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> torch.Tensor:
        x = _batch(self.rank, self.i)
        self.i += 1
        return x


def _loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


def _train(out: str, name: str, rank: int, mesh: Any, clip: float | None) -> list[list[float]]:
    """Two guarded steps; the full weights (every rank gathers them) as nested lists."""
    from training.api import CheckConfig, Guard, GuardConfig

    cfg = GuardConfig(
        run=name, run_dir=Path(out, name), steps=STEPS, use_store=False, grad_clip=clip,
        checks=CheckConfig(checks=("finite",)),
    )  # fmt: skip
    guard = Guard(cfg)
    data = Batches(rank)
    model = guard.prepare_sharded(
        small_model(0), mesh=mesh, loss_fn=_loss,
        make_optimizer=lambda params: torch.optim.SGD(params, lr=LR),
    )  # fmt: skip
    assert guard.run(data) == 0
    return [p.full_tensor().reshape(-1).tolist() for p in model.parameters()]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import os

    from torch.distributed.device_mesh import init_device_mesh

    os.environ["LONGRUN_NODE_NAMES"] = ",".join(f"n{r + 1}" for r in range(world))
    join_group(rank, world, port)
    fsdp = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    write_result(
        out,
        rank,
        {
            "fsdp": _train(out, "fsdp", rank, fsdp, CLIP),
            "hsdp": _train(out, "hsdp", rank, hsdp, CLIP),
            "unclipped": _train(out, "unclipped", rank, fsdp, None),
        },
    )


def _reference(clip: float | None) -> tuple[list[torch.Tensor], list[float]]:
    """The weights after STEPS steps without any process group, and each step's gradient norm."""
    model = small_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    norms = []
    for i in range(STEPS):
        opt.zero_grad()
        loss = sum(_loss(model, _batch(r, i)) for r in range(WORLD)) / WORLD
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        norms.append(float(norm))
        if clip is not None and float(clip / (norm + 1e-6)) < 1.0:
            for g in grads:
                g.mul_(clip / (norm + 1e-6))
        opt.step()
    return [p.detach().reshape(-1) for p in model.parameters()], norms


@pytest.mark.timeout(600)
def test_grad_clip_on_shards_clips_by_the_whole_models_norm(tmp_path) -> None:
    results = spawn_ranks(_worker, WORLD, tmp_path)
    clipped, norms = _reference(CLIP)
    unclipped, _ = _reference(None)
    assert min(norms) > 4 * CLIP, norms  # the clip acts at every step
    for mesh in ("fsdp", "hsdp"):
        for rank, res in enumerate(results):
            got = [torch.tensor(w) for w in res[mesh]]
            for g, want, free in zip(got, clipped, unclipped, strict=True):
                assert torch.allclose(g, want, rtol=0, atol=1e-6), (mesh, rank, (g - want).abs().max())
                assert not torch.allclose(g, free, rtol=0, atol=1e-4), (mesh, rank)
    for rank, res in enumerate(results):  # and without grad_clip, the run is the unclipped reference
        for g, want in zip(res["unclipped"], unclipped, strict=True):
            assert torch.allclose(torch.tensor(g), want, rtol=0, atol=1e-6), rank
