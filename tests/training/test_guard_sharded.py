"""The public Guard around a sharded model: real FSDP2 (`fully_shard`) over a 3 x 2 HSDP `DeviceMesh` on six
real gloo ranks (CPU; nothing mocked), each rank its own node, through `Guard.prepare_sharded` and
`Guard.run`.

In one spawn of six processes, one guarded run after another on the same process group:
- clean: six steps, a sharded save at steps 3 and 6 (written in the background: `dcp.async_save`, while
  the next steps change the weights), the finite check every step and the weight vote at steps 2, 3
  (before the save), 4 and 6 all pass; exit 0, a report; the same run with synchronous saves ends on the
  same shards and writes the same shard files, byte for byte;
- the clean run's saves are uploaded to a local store (every DCP file, then the manifest record, dcp-v1);
- resume: a fresh model (other initial weights) resumes step 3's save from the store (rank 0 fetches it,
  every rank loads it) on the same mesh and ends with every rank's local shards bit-identical to the
  uninterrupted run's (AdamW's state, the scheduler and the data loader's position resumed with it); the
  report's fingerprint, over every rank's shards, equals the clean run's; a resume from the step-6 folder
  on the shared run dir starts at step 6 with the same shards;
- weight-flip drill on rank 3 (one replica of shard 1) after step 2: the weight vote names rank 3, exit 93;
- a NaN in rank 1's input at step 2 (so in its local gradient before the reduce-scatter): the finite check
  fails on every rank without naming anyone (the reduction spread it to every holder of every shard);
- a `nan` drill on rank 4's gradient shard after the reduction: named, rank 4 alone (its replicas are finite);
- the recompute check every 2 steps runs (every rank at once; here each rank is its own node,
  so each rank recomputes its neighbour's micro-batch, in the same shard group or the next) and passes;
- refused at set-up with SetupError: a weight vote on a pure FSDP2 mesh (nothing replicated); FSDP2 with
  the finite check alone runs clean.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from helpers.gloo_ranks import join_group, small_model, spawn_ranks, write_result

WORLD = 6


class Batches:
    """Rank-local micro-batches, stateful (the guard saves and restores the position). `nan_at`: the
    position whose batch holds a NaN."""

    def __init__(self, rank: int, nan_at: int | None = None) -> None:
        self.rank, self.i, self.nan_at = rank, 0, nan_at

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> torch.Tensor:
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1000 * self.i + self.rank))
        if self.i == self.nan_at:
            x[0, 0] = float("nan")
        self.i += 1
        return x

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.i = state["i"]


def _loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


def _guarded(
    out: str, name: str, rank: int, mesh: Any, *, checks: tuple[str, ...] = ("finite", "weight_vote"),
    seed: int = 0, resume_from: str | None = None, faults: tuple[Any, ...] = (), nan_at: int | None = None,
    recompute_every: int = 0, use_store: bool = False, async_save: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """One guarded run of six steps on `mesh`: its exit code, every rank's local shards' fingerprints at the
    end, its start step, and its alert (if any)."""
    from training.api import CheckConfig, Guard, GuardConfig
    from training.fingerprint.host import fingerprint_state, local_state

    run_dir = Path(out, name)
    cfg = GuardConfig(
        run=name, run_dir=run_dir, steps=6, checkpoint_every=3, use_store=use_store, resume_from=resume_from,
        checks=CheckConfig(checks=checks, recompute_every=recompute_every, vote_every=2), async_save=async_save,
    )  # fmt: skip
    guard = Guard(cfg, faults=faults)
    data = Batches(rank, nan_at=nan_at)
    model = guard.prepare_sharded(
        small_model(seed), mesh=mesh, loss_fn=_loss, state={"data": data},
        make_optimizer=lambda params: torch.optim.AdamW(params, lr=0.05),
        make_scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    )  # fmt: skip
    code = guard.run(data)
    alerts = [json.loads(p.read_text()) for p in sorted((run_dir / "alerts").glob("*.json"))]
    return {
        "code": code,
        "background": guard.saves_in_background,
        "start": guard.start_step,
        "shards": fingerprint_state(local_state(model.state_dict())),
        "alerts": [
            {
                "check": a["check"],
                "step": a["step"],
                "suspects": a["suspect_ranks"],
                "evidence": a["evidence"],
            }
            for a in alerts
        ],
    }


def _refused(out: str, name: str, rank: int, mesh: Any, **kw: Any) -> str:
    from training.api import SetupError

    try:
        _guarded(out, name, rank, mesh, **kw)
    except SetupError as e:
        return str(e)
    return "not refused"


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from training.faults import Fault

    os.environ["LONGRUN_NODE_NAMES"] = ",".join(f"n{r + 1}" for r in range(world))
    os.environ["LONGRUN_STORE_DIR"] = str(Path(out, "store"))  # a local store (training.store), no server
    join_group(rank, world, port)
    found: dict[str, Any] = {}
    try:
        hsdp = init_device_mesh("cpu", (3, 2), mesh_dim_names=("replicate", "shard"))
        found["clean"] = _guarded(out, "clean", rank, hsdp, use_store=True)
        (incarnation,) = Path(out, "clean", "sharded-checkpoints").iterdir()  # one folder per incarnation
        found["sharded_saves"] = sorted(p.name for p in incarnation.iterdir())
        found["sync"] = _guarded(out, "sync", rank, hsdp, async_save=False)
        # The relaunch's path: rank 0 fetches the uploaded checkpoint from the store, every rank loads it.
        step3 = "runs/clean/checkpoints/step-00000003/"
        found["resumed"] = _guarded(out, "resumed", rank, hsdp, seed=1, resume_from=step3, use_store=True)
        step6 = str(incarnation / "step-00000006")
        found["resumed_folder"] = _guarded(out, "resumed-folder", rank, hsdp, seed=1, resume_from=step6)
        found["flip"] = _guarded(out, "flip", rank, hsdp, faults=(Fault(kind="weight-flip", step=2, rank=3),))
        found["nan_input"] = _guarded(out, "nan-input", rank, hsdp, nan_at=1 if rank == 1 else None)
        found["nan_shard"] = _guarded(
            out, "nan-shard", rank, hsdp, faults=(Fault(kind="nan", step=2, rank=4),)
        )
        found["recompute"] = _guarded(
            out, "recompute", rank, hsdp, checks=("finite", "recompute", "weight_vote"), recompute_every=2
        )
        fsdp = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
        found["fsdp_vote"] = _refused(out, "fsdp-vote", rank, fsdp)
        found["fsdp_finite"] = _guarded(out, "fsdp-finite", rank, fsdp, checks=("finite",))["code"]
        write_result(out, rank, found)
    finally:
        dist.destroy_process_group()


def test_guard_on_hsdp_passes_clean_resumes_exactly_and_names_faults(tmp_path: Path) -> None:
    per_rank = spawn_ranks(_worker, WORLD, tmp_path)
    for rank, found in enumerate(per_rank):
        clean, resumed = found["clean"], found["resumed"]
        assert (clean["code"], clean["alerts"]) == (0, []), (rank, clean)
        assert found["sharded_saves"] == ["step-00000003", "step-00000006"]
        assert (clean["background"], found["sync"]["background"]) == (True, False)
        assert found["sync"]["shards"] == clean["shards"], rank
        assert (resumed["code"], resumed["start"], resumed["alerts"]) == (0, 3, []), (rank, resumed)
        assert resumed["shards"] == clean["shards"], rank  # bit for bit, every local shard
        assert found["resumed_folder"]["start"] == 6 and found["resumed_folder"]["shards"] == clean["shards"]

        # One alert per verdict (its writer is one rank; the run dir is shared here), read after the exit.
        flip = found["flip"]
        assert flip["code"] == 93, (rank, flip)
        (alert,) = flip["alerts"]
        assert (alert["check"], alert["step"], alert["suspects"]) == ("weight_vote", 2, [3])
        assert alert["evidence"]["shards"]["1"]["ranks"] == [1, 3, 5]

        assert found["nan_input"]["code"] == 93 and found["nan_shard"]["code"] == 93, rank
        assert (found["recompute"]["code"], found["recompute"]["alerts"]) == (0, []), found["recompute"]
        assert found["recompute"]["shards"] == clean["shards"], rank  # the recompute changes nothing
        assert "leave 'weight_vote' out of CheckConfig.checks" in found["fsdp_vote"], found["fsdp_vote"]
        assert "6 shard(s) x 1 replica(s)" in found["fsdp_vote"]
        assert found["fsdp_finite"] == 0

    report = json.loads((tmp_path / "clean" / "report.json").read_text())
    every_shard = {
        f"{r}/{n}": fp for r, found in enumerate(per_rank) for n, fp in found["clean"]["shards"].items()
    }
    assert report["final_step"] == 6 and report["fingerprints"] == every_shard
    resumed_report = json.loads((tmp_path / "resumed" / "report.json").read_text())
    assert resumed_report["final_fingerprint"] == report["final_fingerprint"]
    # Both saves reached the store, each with its files and its record (manifest.json) last.
    ckpts = tmp_path / "store" / "runs" / "clean" / "checkpoints"
    for step in ("step-00000003", "step-00000006"):
        record = json.loads((ckpts / step / "manifest.json").read_text())
        assert record["format"] == "dcp-v1" and set(record["shard_fingerprints"]) == {
            str(r) for r in range(WORLD)
        }
        assert {f["name"] for f in record["files"]} >= {".metadata", "sharded-manifest.json", "extra.pt"}
    assert (tmp_path / "resumed" / "resume" / "step-00000003" / "sharded-manifest.json").is_file()
    for step in ("step-00000003", "step-00000006"):  # the async saves hold what the synchronous ones hold
        (background,) = (tmp_path / "clean" / "sharded-checkpoints").glob(f"*/{step}/sharded-manifest.json")
        (synchronous,) = (tmp_path / "sync" / "sharded-checkpoints").glob(f"*/{step}/sharded-manifest.json")
        a, b = json.loads(background.read_text()), json.loads(synchronous.read_text())
        assert a["shard_fingerprints"] == b["shard_fingerprints"]
        assert {f["name"] for f in a["files"]} == {f["name"] for f in b["files"]}
        shard_files = {f["name"]: f["sha256"] for f in a["files"] if f["name"].endswith(".distcp")}
        assert len(shard_files) == WORLD
        assert shard_files == {f["name"]: f["sha256"] for f in b["files"] if f["name"].endswith(".distcp")}
    (nan_input,) = per_rank[0]["nan_input"]["alerts"]
    assert (nan_input["check"], nan_input["step"], nan_input["suspects"]) == ("finite", 2, [])
    assert nan_input["evidence"]["flags_by_rank"] == [1] * WORLD
    assert "came through the reduction" in nan_input["evidence"]["why_unnamed"]
    (nan_shard,) = per_rank[0]["nan_shard"]["alerts"]
    assert (nan_shard["check"], nan_shard["step"], nan_shard["suspects"]) == ("finite", 2, [4])
    assert nan_shard["evidence"]["flags_by_rank"] == [0, 0, 0, 0, 1, 0]
    # Each rank holds its own shards (the comparison above is of shards, per rank, not of one copy).
    assert len({json.dumps(found["clean"]["shards"], sort_keys=True) for found in per_rank}) == 2
