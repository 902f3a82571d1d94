"""Sharded checkpoints (training.checkpoint.sharded) on six real gloo ranks with FSDP2 over a 3 x 2 HSDP mesh:
saved with torch.distributed.checkpoint, resumed bit-identically on the same mesh, refused when a file is
corrupted or missing, and refused on another mesh. Validation of damaged copies runs in this process, as
an auditor would run it: no process group."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from helpers.gloo_ranks import join_group, small_model, spawn_ranks, write_result

from training.checkpoint.sharded import MANIFEST, validate_sharded


def _model(mesh, seed: int):
    from torch.distributed.fsdp import fully_shard

    model = small_model(seed)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def _train(model, opt, rank: int, steps: range) -> None:
    for step in steps:
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank))
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from training.checkpoint.manifest import CheckpointError
    from training.checkpoint.sharded import load_sharded, save_sharded
    from training.fingerprint.host import fingerprint_state, local_state

    join_group(rank, world, port)
    found: dict[str, object] = {}
    try:
        mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("replicate", "shard"))
        model, opt = _model(mesh, seed=0)
        _train(model, opt, rank, range(2))
        folder = Path(out, "step-2")
        manifest = save_sharded(folder, model, opt, step=2, mesh=mesh, extra={"run": "t"})
        at_save = fingerprint_state(local_state(model.state_dict()))
        found["manifest_same_everywhere"] = manifest
        # Train on, then a fresh model (other init) resumes the save: the shards are the saved ones.
        _train(model, opt, rank, range(2, 4))
        later = fingerprint_state(local_state(model.state_dict()))
        fresh, fresh_opt = _model(mesh, seed=1)
        load_sharded(folder, fresh, fresh_opt, mesh=mesh)
        found["resumed_equals_saved"] = fingerprint_state(local_state(fresh.state_dict())) == at_save
        found["later_differs"] = later != at_save
        # The resumed optimizer continues exactly as the original did from step 2.
        _train(fresh, fresh_opt, rank, range(2, 4))
        found["continued_equals_uninterrupted"] = fingerprint_state(local_state(fresh.state_dict())) == later
        # A corrupted copy is refused on every rank before anything is loaded.
        bad = Path(out, "step-2-bad")
        if rank == 0:
            shutil.copytree(folder, bad)
            blob = bytearray((bad / "__3_0.distcp").read_bytes())
            blob[len(blob) // 2] ^= 0x10
            (bad / "__3_0.distcp").write_bytes(bytes(blob))
        dist.barrier()
        try:
            load_sharded(bad, fresh, fresh_opt, mesh=mesh)
            found["corrupt"] = "loaded"
        except CheckpointError as e:
            found["corrupt"] = str(e)
        # Another mesh over the same six ranks: refused, not resharded.
        other = init_device_mesh("cpu", (2, 3), mesh_dim_names=("replicate", "shard"))
        wrong, wrong_opt = _model(other, seed=2)
        try:
            load_sharded(folder, wrong, wrong_opt, mesh=other)
            found["other_mesh"] = "loaded"
        except CheckpointError as e:
            found["other_mesh"] = str(e)
        write_result(out, rank, found)
    finally:
        dist.destroy_process_group()


def _damaged(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_sharded_save_resumes_bit_identically_and_damage_is_named(tmp_path: Path) -> None:
    per_rank = spawn_ranks(_worker, 6, tmp_path)
    manifests = {json.dumps(r["manifest_same_everywhere"], sort_keys=True) for r in per_rank}
    assert len(manifests) == 1
    manifest = per_rank[0]["manifest_same_everywhere"]
    assert manifest["world_size"] == 6 and manifest["mesh"] == {
        "dims": ["replicate", "shard"],
        "shape": [3, 2],
    }
    assert {f["name"] for f in manifest["files"]} == {".metadata"} | {f"__{r}_0.distcp" for r in range(6)}
    for r, res in enumerate(per_rank):
        assert res["resumed_equals_saved"] is True, r
        assert res["later_differs"] is True, r
        assert res["continued_equals_uninterrupted"] is True, r
        assert "__3_0.distcp: SHA-256 differs" in res["corrupt"], res["corrupt"]
        assert "Resharding is refused" in res["other_mesh"] and "[3, 2]" in res["other_mesh"], res[
            "other_mesh"
        ]

    saved = tmp_path / "step-2"
    assert validate_sharded(saved) == []
    # A missing rank file: named, never whole.
    gone = _damaged(saved, tmp_path / "gone")
    (gone / "__5_0.distcp").unlink()
    assert validate_sharded(gone) == [f"__5_0.distcp: listed in the manifest, missing from {gone}"]
    # A manifest that leaves a rank's shard out (saved by fewer ranks than it claims).
    short = _damaged(saved, tmp_path / "short")
    m = json.loads((short / MANIFEST).read_text())
    m["files"] = [f for f in m["files"] if f["name"] != "__4_0.distcp"]
    (short / MANIFEST).write_text(json.dumps(m))
    (short / "__4_0.distcp").unlink()
    assert validate_sharded(short) == ["__4_0.distcp: not in the manifest of a 6-rank checkpoint"]
    # No manifest (a save cut short): incomplete.
    cut = _damaged(saved, tmp_path / "cut")
    (cut / MANIFEST).unlink()
    (problem,) = validate_sharded(cut)
    assert "is missing: the checkpoint is incomplete" in problem
    # A stray file beside the checkpoint's own.
    stray = _damaged(saved, tmp_path / "stray")
    (stray / "__6_0.distcp").write_bytes(b"x")
    assert validate_sharded(stray) == [f"__6_0.distcp: in {stray}, not in its manifest"]
