"""The weight vote under sharded data parallelism: real FSDP2 (`fully_shard`) over a 2-D `DeviceMesh` on six
gloo ranks, and the replica layout it votes within.

One world of six processes carries two meshes: HSDP with 3 replica groups x 2 shards, and 2 replica groups x
3 shards. Each model trains two steps so the shards hold trained values, then:
- a clean vote within the replica layout passes on every rank;
- the same weights voted world-wide (the pre-sharding vote) fail without naming anyone: the false alarm the
  layout exists to avoid;
- one flipped bit in one rank's local shard is named (rank and tensor) by 3 replicas, and seen but not named
  by 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.gloo_ranks import join_group, small_model, spawn_ranks, write_result

from training.checks.replicas import ReplicaLayout
from training.checks.weight_vote import WeightVoteCheck


def test_layout_from_a_mesh_groups_ranks_by_the_shard_they_hold() -> None:
    hsdp = ReplicaLayout.from_ranks([[0, 1], [2, 3], [4, 5]], ("replicate", "shard"), ("replicate",))
    assert hsdp.shard_of == (0, 1, 0, 1, 0, 1)
    assert (hsdp.shards, hsdp.replicas, hsdp.votable) == (2, 3, True)
    assert hsdp.holders(1) == [1, 3, 5]
    # Tensor parallel beside HSDP: ranks with the same (shard, tp) coordinates hold the same weights.
    tp = ReplicaLayout.from_ranks(
        [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], ("replicate", "shard", "tp"), ("replicate",)
    )
    assert tp.shard_of == (0, 1, 2, 3, 0, 1, 2, 3) and tp.replicas == 2
    assert ReplicaLayout.from_ranks([[0, 1, 2, 3]], ("replicate", "shard"), ("replicate",)).votable is False
    assert ReplicaLayout.from_ranks([0, 1, 2], ("replicate",), ("replicate",)) == ReplicaLayout.ddp(3)


@pytest.mark.parametrize(
    ("ranks", "names", "replicate", "match"),
    [
        ([[0, 1], [2, 3]], ("replicate", "shard"), ("dp",), "not in the mesh"),
        ([[0, 1], [1, 3]], ("replicate", "shard"), ("replicate",), "exactly once"),
        ([[0, 1], [2]], ("replicate", "shard"), ("replicate",), "exactly once"),
        ([[0, 1], [2, "x"]], ("replicate", "shard"), ("replicate",), "is not a rank"),
    ],
)
def test_a_mesh_that_is_not_one_rank_per_cell_is_refused(ranks, names, replicate, match) -> None:
    with pytest.raises(ValueError, match=match):
        ReplicaLayout.from_ranks(ranks, names, replicate)


def test_a_layout_without_replicas_cannot_carry_a_vote() -> None:
    with pytest.raises(ValueError, match="compares nothing"):
        WeightVoteCheck(every=1, layout=ReplicaLayout((0, 1, 2, 3)))
    with pytest.raises(ValueError, match="equally many"):
        ReplicaLayout((0, 0, 1))


def _flip(model: torch.nn.Module, name: str) -> None:
    local = model.state_dict()[name].to_local()
    words = local.view(-1).view(torch.int32)
    words[3] ^= 1 << 2  # one low mantissa bit: tiny, finite


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from training.checks.base import StepContext

    join_group(rank, world, port)
    results: dict[str, object] = {}
    try:
        for shape in ((3, 2), (2, 3)):
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
            model = small_model(0)
            for layer in (model[0], model[2]):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(2):
                x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank))
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
            layout = ReplicaLayout.from_mesh(mesh)
            ctx = StepContext(
                step=2, rank=rank, nodes=[f"n{r // 2 + 1}" for r in range(world)], device=torch.device("cpu"),
                model=model, loss=torch.zeros(()),
            )  # fmt: skip
            tag = "x".join(map(str, shape))
            clean = WeightVoteCheck(every=1, layout=layout).after_update(ctx)
            worldwide = WeightVoteCheck(every=1).after_update(ctx)
            victim = 3
            if rank == victim:
                _flip(model, "2.weight")
            flipped = WeightVoteCheck(every=1, layout=layout).after_update(ctx)
            assert clean is not None and worldwide is not None and flipped is not None
            results[tag] = {
                "layout": list(layout.shard_of),
                "clean": clean.verdict,
                "manifest_fps": "fingerprints" in clean.extra,
                "worldwide": [
                    worldwide.verdict,
                    worldwide.suspect_ranks,
                    worldwide.evidence.get("why_unnamed"),
                ],
                "flipped": [flipped.verdict, flipped.suspect_ranks, flipped.evidence.get("why_unnamed")],
                "differing": flipped.evidence.get("tensors_differing_from_majority"),
                "shards": flipped.evidence.get("shards"),
            }
            dist.barrier()
        write_result(out, rank, results)
    finally:
        dist.destroy_process_group()


def test_hsdp_vote_passes_clean_and_names_a_flipped_shard(tmp_path: Path) -> None:
    per_rank = spawn_ranks(_worker, 6, tmp_path)
    for res in per_rank:
        three, two = res["3x2"], res["2x3"]
        assert three["layout"] == [0, 1, 0, 1, 0, 1] and two["layout"] == [0, 1, 2, 0, 1, 2]
        for case in (three, two):
            assert case["clean"] == "pass"
            assert case["manifest_fps"] is False  # shards are not whole tensors: not manifest values
            verdict, suspects, why = case["worldwide"]
            assert verdict == "fail" and suspects == [] and why == "no strict majority of replicas"
        # Three replicas of shard 1 (ranks 1, 3, 5): rank 3 is outvoted and named, with its tensor.
        assert three["flipped"] == ["fail", [3], None]
        assert three["differing"] == {"3": ["2.weight"]}
        assert three["shards"] == {
            "1": {"ranks": [1, 3, 5], "majority": three["shards"]["1"]["majority"], "dissent": [3]}
        }
        # Two replicas of shard 0 (ranks 0, 3): a difference is seen, no side can be named.
        verdict, suspects, why = two["flipped"]
        assert (
            verdict == "fail" and suspects == [] and why == "no strict majority of replicas for shard(s) [0]"
        )
        assert list(two["shards"]) == ["0"] and two["shards"]["0"]["ranks"] == [0, 3]
    # Every rank reached the same verdict from the one gather.
    assert len({json.dumps(r, sort_keys=True) for r in per_rank}) == 1
