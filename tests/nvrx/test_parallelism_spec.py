"""The `parallelism` and `ranks_per_node` Params: what RunSpec accepts and refuses (by name, before anything
reaches Slurm), and what the launch makes of them (ranks per node in the script, LONGRUN_PARALLELISM)."""

from __future__ import annotations

import pytest
from longrun.launch import job_spec_for_run
from longrun.runspec import RunSpec, RunSpecError
from longrun.slurm.render import render_sbatch
from longrun.slurm.spec import JobTag

TAG = JobTag(dag_id="training_run", run_id="manual__2026-12-07T10:00:00+00:00", task_id="submit")
HSDP = dict(
    run_name="hsdp", nodes=3, gpus_per_node=0, ranks_per_node=2, parallelism="hsdp", recompute_every=0
)


def test_defaults_are_ddp_with_one_rank_per_gpu_or_per_cpu_node() -> None:
    assert RunSpec(run_name="r", gpus_per_node=8).world_size == 3 * 8
    cpu = RunSpec(run_name="r", gpus_per_node=0)
    assert (cpu.parallelism, cpu.node_ranks, cpu.world_size) == ("ddp", 1, 3)
    assert cpu.job_env(run_dir="/runs/r")["LONGRUN_PARALLELISM"] == "ddp"


def test_hsdp_on_cpu_nodes_with_two_ranks_each() -> None:
    spec = RunSpec(**HSDP)
    assert (spec.node_ranks, spec.world_size) == (2, 6)
    assert spec.job_env(run_dir="/runs/hsdp")["LONGRUN_PARALLELISM"] == "hsdp"
    script = render_sbatch(
        job_spec_for_run(spec, tag=TAG, run_dir_root="/runs", env={"LONGRUN_STORE_DIR": "/store"})
    )
    assert "--nproc-per-node=2" in script
    assert "export LONGRUN_PARALLELISM=hsdp" in script


def test_a_relaunch_keeps_the_parallelism_and_the_ranks_per_node() -> None:
    again = RunSpec(**HSDP).relaunch(resume_from="runs/hsdp/checkpoints/step-00000010/", exclude=("n2",))
    assert (again.parallelism, again.node_ranks, again.world_size) == ("hsdp", 2, 6)


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"parallelism": "zero3"}, "parallelism", "must be one of ddp, fsdp, hsdp"),
        ({"nodes": 1}, "nodes", "2 nodes or more"),
        ({"spare_nodes": 1}, "spare_nodes", "not built for sharded runs yet"),
        ({"gpus_per_node": 8, "ranks_per_node": 2}, "ranks_per_node", "one rank per GPU"),
        ({"ranks_per_node": 65}, "ranks_per_node", ""),
    ],
)
def test_refused_by_name(changes: dict[str, object], field: str, says: str) -> None:
    with pytest.raises(RunSpecError) as e:
        RunSpec(**{**HSDP, **changes})  # type: ignore[arg-type]
    assert e.value.field == field and says in str(e.value)


def test_fsdp_runs_on_one_node_and_both_sharded_parallelisms_take_the_recompute() -> None:
    assert RunSpec(**{**HSDP, "parallelism": "fsdp", "nodes": 1}).world_size == 2
    for parallelism in ("hsdp", "fsdp"):
        spec = RunSpec(**{**HSDP, "parallelism": parallelism, "recompute_every": 5})  # type: ignore[arg-type]
        assert spec.job_env(run_dir="/runs/hsdp")["LONGRUN_RECOMPUTE_EVERY"] == "5"


@pytest.mark.parametrize(
    ("changes", "checks"),
    [
        ({"parallelism": "ddp", "recompute_every": 5}, ("finite", "recompute", "weight_vote")),
        ({"parallelism": "ddp", "recompute_every": 0}, ("finite", "weight_vote")),
        ({}, ("finite", "weight_vote")),  # hsdp, recompute_every 0
        ({"recompute_every": 5}, ("finite", "recompute", "weight_vote")),  # hsdp: every rank at once
        ({"parallelism": "fsdp", "nodes": 1}, ("finite",)),
        ({"parallelism": "fsdp", "nodes": 1, "recompute_every": 5}, ("finite", "recompute")),
    ],
)
def test_the_checks_a_launch_runs_for_the_pick(changes: dict[str, object], checks: tuple[str, ...]) -> None:
    assert RunSpec(**{**HSDP, **changes}).checks_run() == checks  # type: ignore[arg-type]
