"""`sharding.mesh_for`: the layouts it refuses, by name, before any process group is touched (the meshes it
builds are exercised on real gloo ranks in test_guard_sharded.py and by the trainer in tests/e2e)."""

from __future__ import annotations

import pytest

from training.api.sharding import mesh_for
from training.config import PARALLELISMS, TrainConfig, model_preset, parallelism_from_env


def test_ddp_has_no_mesh() -> None:
    assert mesh_for("ddp", nodes=["n1", "n2"], device_type="cpu") is None


@pytest.mark.parametrize(
    ("parallelism", "nodes", "says"),
    [
        ("zero3", ["n1", "n2"], "is not one of ddp, fsdp, hsdp"),
        ("hsdp", ["n1", "n1"], "needs 2 nodes or more"),
        ("hsdp", ["n1", "n1", "n2"], "the same number of ranks on every node"),
        ("hsdp", ["n1", "n2", "n1", "n2"], "numbered one node after another"),
    ],
)
def test_refused_layouts(parallelism: str, nodes: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        mesh_for(parallelism, nodes=nodes, device_type="cpu")


def test_the_environment_names_the_parallelism() -> None:
    assert parallelism_from_env({}) == "ddp"
    assert parallelism_from_env({"LONGRUN_PARALLELISM": " hsdp "}) == "hsdp"
    with pytest.raises(ValueError, match="LONGRUN_PARALLELISM='tp'"):
        parallelism_from_env({"LONGRUN_PARALLELISM": "tp"})
    assert PARALLELISMS == ("ddp", "fsdp", "hsdp")


def test_the_trainer_config_refuses_an_unknown_parallelism(tmp_path) -> None:
    with pytest.raises(ValueError, match="parallelism must be one of"):
        TrainConfig(run="r", run_dir=tmp_path, steps=1, model=model_preset("tiny"), parallelism="tp")


@pytest.mark.parametrize(
    ("parallelism", "checks", "grad_clip"),
    [
        ("ddp", ("finite", "recompute", "weight_vote"), 1.0),
        ("hsdp", ("finite", "recompute", "weight_vote"), 1.0),  # recompute_every 0 leaves it unbuilt
        ("fsdp", ("finite", "recompute"), 1.0),  # nothing replicated: no vote (logged)
    ],
)
def test_the_reference_trainer_per_parallelism(
    tmp_path, parallelism: str, checks: tuple[str, ...], grad_clip: float | None
) -> None:
    from training.train import build_parser, config_from_args

    args = build_parser().parse_args(
        ["--run-dir", str(tmp_path), "--steps", "4", "--recompute-every", "0", "--parallelism", parallelism]
    )
    cfg, _faults = config_from_args(args)
    assert (cfg.parallelism, cfg.checks.checks, cfg.grad_clip) == (parallelism, checks, grad_clip)
