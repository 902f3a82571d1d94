"""The weight vote with each fingerprint algorithm, on a real 3-rank gloo group (3 processes).

CUDA is not here: the dfp64 algorithm (the one the vote picks for CUDA weights) is forced on CPU tensors;
it is the same torch code that runs on the GPU. A flipped weight bit on one replica must be named.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from training.checks.weight_vote import ALGORITHMS, WeightVoteCheck, algorithm_for


def test_algorithm_follows_the_device() -> None:
    assert algorithm_for(torch.device("cpu")) == "xxh3-64"
    assert algorithm_for(torch.device("cuda", 0)) == "dfp64-v1"
    with pytest.raises(ValueError, match="algorithm"):
        WeightVoteCheck(every=1, algorithm="sha1")


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch import nn

    from training.checks.base import StepContext

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 33), nn.Linear(33, 3, dtype=torch.bfloat16))
        results = {}
        for algo in ALGORITHMS:
            for flipped in (False, True):
                if flipped and rank == 1:
                    w = model[0].weight.data.view(-1).view(torch.int32)
                    w[100] ^= 1 << 3  # one low mantissa bit: a tiny, finite change
                ctx = StepContext(
                    step=1, rank=rank, nodes=[f"n{i}" for i in range(world)], device=torch.device("cpu"),
                    model=model, loss=torch.zeros(()),
                )  # fmt: skip
                r = WeightVoteCheck(every=1, algorithm=algo).after_update(ctx)
                assert r is not None
                results[f"{algo}:{flipped}"] = {
                    "verdict": r.verdict, "suspects": r.suspect_ranks, "algorithm": r.evidence["algorithm"],
                    "differing": r.evidence.get("tensors_differing_from_majority"),
                    "manifest_fps": "fingerprints" in r.extra,
                }  # fmt: skip
                if flipped and rank == 1:
                    w[100] ^= 1 << 3
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def test_vote_names_the_flipped_replica_with_each_algorithm(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_worker, args=(3, port, str(tmp_path)), nprocs=3, join=True, start_method="spawn")
    for rank in range(3):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for algo in ALGORITHMS:
            clean, bad = res[f"{algo}:False"], res[f"{algo}:True"]
            assert clean["verdict"] == "pass" and clean["algorithm"] == algo
            # Only xxh3 values may go into the manifest (the validator recomputes xxh3).
            assert clean["manifest_fps"] is (algo == "xxh3-64")
            assert bad["verdict"] == "fail" and bad["suspects"] == [1]
            assert bad["differing"] == {"1": ["0.weight"]}
