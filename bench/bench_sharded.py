"""What the guard costs on a sharded model: step time of the guarded HSDP loop against the same loop without
longrun, per check and at the default cadences, with sharded checkpoints off and on; FSDP2 beside it. All
measured side by side in one run.

    python bench/bench_sharded.py [--model small] [--ranks 6] [--shard 2] [--steps 20] [--cadence 10] [--fsdp2]

Starts `--ranks` gloo ranks on this host (bench/launch_ranks.py). Every rank builds one copy of the reference
model per variant (the same seed: the same initial weights), and every variant trains on the same
micro-batches (`--cadence` of them per rank, used in turn):

    hsdp                 the user's loop without longrun: `fully_shard` of the root over the
                         ("replicate", "shard") mesh (ranks/shard x shard), AdamW, no clipping
    guard:none           training.api.Guard.prepare_sharded on the same mesh, no check (its RNG fork, the
                         mean-loss all-reduce, the records and the heartbeat)
    guard:finite@1       the sharded finite check at every step (one int64 all-gather)
    guard:vote@1         the weight vote at every step (xxh3 of the local shards, one int64 all-gather)
    guard:recompute@1    the recompute by replica groups at every step (every rank recomputes, forward and
                         backward, the micro-batch of a rank on another node; its collectives; the local
                         gradient's fingerprint in the real and the recomputed backward; one all-gather)
    guard:default        what an HSDP run gets by default (training.config.checks_for_parallelism): finite
                         at every step, the recompute every CheckConfig().recompute_every and the vote every
                         CheckConfig().vote_every
    guard:default+ckpt   the same, and a sharded checkpoint (training.checkpoint.sharded, DCP) every
                         `--cadence` steps (the launch's default checkpoint_every is 10: RunSpec), written
                         in the background (`dcp.async_save`, GuardConfig.async_save, the default)
    guard:default+ckpt-sync  the same with GuardConfig(async_save=False): the step waits for every file
    fsdp2                with --fsdp2: the user's loop on a ("shard",) mesh over every rank
    fsdp2 guard:default  with --fsdp2: the guard on it with what an FSDP2 run gets by default: the finite
                         check and the recompute (the vote has no replica to compare there)

The variants take turns step by step: in each round every variant takes one step (after a barrier), in an
order rotated round by round, so a burst of other load on the host hits all of them alike. `--steps` (a
multiple of `--cadence`) rounds are timed: each variant's timed steps hold exactly steps/cadence vote steps
and saves. A step's time is the mean over the ranks of each rank's time from the barrier to the end of its
step. The table gives, per variant, the median and p95 over its timed steps (a vote or a save is one step in
`--cadence`: it shows in p95 and the mean, not in the median) and the mean (the amortised cost), each
against the unguarded loop on the same mesh; `paired`: the median over rounds of the step's time over the
unguarded step's in the same round (like the median, it leaves out the one-in-cadence steps); and the CPU
time of a step (`time.process_time`: every thread of the rank, gloo's and DCP's included), summed over the
ranks, mean over the steps: the work the guard adds, which other load on the host and the ranks' waits on
each other (on an oversubscribed host, the larger part of a collective's wall time) do not move much.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from launch_ranks import run_ranks

UNGUARDED = {"hsdp": "hsdp", "fsdp2": "fsdp2"}
"""The unguarded loop of each mesh: what the guarded variants on that mesh are compared with."""


def variants(cadence: int, fsdp2: bool) -> dict[str, dict[str, Any]]:
    """Every variant's mesh and, for a guarded one, its checks and the cadences of its recompute, vote
    and checkpoints."""
    from training.config import CheckConfig, checks_for_parallelism

    d = CheckConfig()
    off = {"recompute_every": 0, "vote_every": 0, "checkpoint_every": 0}
    default = {
        "checks": checks_for_parallelism("hsdp", d.checks),
        "recompute_every": d.recompute_every, "vote_every": d.vote_every, "checkpoint_every": 0,
    }  # fmt: skip
    out: dict[str, dict[str, Any]] = {
        "hsdp": {"mesh": "hsdp"},
        "guard:none": {"mesh": "hsdp", "checks": (), **off},
        "guard:finite@1": {"mesh": "hsdp", "checks": ("finite",), **off},
        "guard:vote@1": {"mesh": "hsdp", "checks": ("weight_vote",), **off, "vote_every": 1},
        "guard:recompute@1": {"mesh": "hsdp", "checks": ("recompute",), **off, "recompute_every": 1},
        "guard:default": {"mesh": "hsdp", **default},
        "guard:default+ckpt": {"mesh": "hsdp", **default, "checkpoint_every": cadence},
        "guard:default+ckpt-sync": {
            "mesh": "hsdp",
            **default,
            "checkpoint_every": cadence,
            "async_save": False,
        },
    }
    if fsdp2:
        out["fsdp2"] = {"mesh": "fsdp2"}
        out["fsdp2 guard:default"] = {
            "mesh": "fsdp2", **default, "checks": checks_for_parallelism("fsdp", d.checks), "vote_every": 0,
        }  # fmt: skip
    return out


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from training.api import CheckConfig, Guard, GuardConfig
    from training.config import model_preset
    from training.data import SyntheticBatches
    from training.model import build_model, lm_loss

    # The group first, so that no guard owns it: several guards live side by side in this process.
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model_cfg = model_preset(args.model)
    meshes = {
        "hsdp": init_device_mesh(
            "cpu", (world // args.shard, args.shard), mesh_dim_names=("replicate", "shard")
        ),
        "fsdp2": init_device_mesh("cpu", (world,), mesh_dim_names=("shard",)),
    }

    def adamw(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01, foreach=False)

    steps: dict[str, Any] = {}
    guards = []
    for name, v in variants(args.cadence, args.fsdp2).items():
        model = build_model(model_cfg, seed=0)
        if "checks" not in v:
            fully_shard(model, mesh=meshes[v["mesh"]])
            opt = adamw(model.parameters())

            def plain(batch: Any, model: Any = model, opt: Any = opt) -> None:
                opt.zero_grad(set_to_none=True)
                lm_loss(model, batch).backward()
                opt.step()

            steps[name] = plain
            continue
        run = name.replace(":", "-").replace("@", "-").replace("+", "-").replace(" ", "-")
        cfg = GuardConfig(
            run=run, run_dir=Path(args.run_dir, run), steps=10**9, use_store=False,
            checkpoint_every=v["checkpoint_every"], async_save=v.get("async_save", True),
            checks=CheckConfig(checks=v["checks"], recompute_every=v["recompute_every"], vote_every=v["vote_every"]),
        )  # fmt: skip
        guard = Guard(cfg, faults=())
        guard.prepare_sharded(model, mesh=meshes[v["mesh"]], make_optimizer=adamw, loss_fn=lm_loss)
        guards.append(guard)

        def guarded(batch: Any, guard: Guard = guard) -> None:
            out = guard.step(batch)
            assert out.failed is None, f"false alert in the benchmark at step {out.step}: {out.failed}"

        steps[name] = guarded

    data = SyntheticBatches(model_cfg, seed=0, rank=rank)
    batches = [next(data) for _ in range(args.cadence)]
    names = list(steps)
    for i in range(args.warmup):
        for name in names:
            steps[name](batches[i % len(batches)])
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate: no fixed order bias
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            steps[name](batches[r % len(batches)])
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
        if rank == 0 and args.verbose:
            done = " ".join(f"{n} {wall[n][-1] * 1e3:.0f}" for n in names)
            print(f"  round {r + 1}: {done} ms", file=sys.stderr, flush=True)
    every: list[Any] = [None] * world
    dist.all_gather_object(every, (wall, cpu))
    if rank == 0:
        result = {
            "step_s": {
                n: [statistics.fmean(w[n][i] for w, _ in every) for i in range(args.rounds)] for n in names
            },
            "cpu_s": {n: [sum(c[n][i] for _, c in every) for i in range(args.rounds)] for n in names},
            "params": sum(p.numel() for p in build_model(model_cfg, seed=0).parameters()),
            "torch": torch.__version__,
        }
        Path(args.out).write_text(json.dumps(result))
    for guard in guards:
        guard.exit_code = 0
        guard.close()
    dist.destroy_process_group()


def p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def table(result: dict[str, Any]) -> list[str]:
    """The printed table: one row per variant, ratios against the unguarded loop on its mesh."""
    times, cpu = result["step_s"], result["cpu_s"]
    names = list(times)
    base_of = {n: UNGUARDED["fsdp2" if n.startswith("fsdp2") else "hsdp"] for n in names}

    def stats(n: str) -> tuple[float, float, float, float]:
        return (
            statistics.median(times[n]),
            p95(times[n]),
            statistics.fmean(times[n]),
            statistics.fmean(cpu[n]),
        )

    rows = [
        f"{'variant':<24} {'median ms':>9} {'ratio':>6} {'p95 ms':>8} {'ratio':>6} {'mean ms':>8} {'ratio':>6} "
        f"{'paired':>7} {'CPU ms':>7} {'ratio':>6}"
    ]
    for n in names:
        base = base_of[n]
        (med, high, mean, work), (b_med, b_high, b_mean, b_work) = stats(n), stats(base)
        paired = statistics.median(t / b for t, b in zip(times[n], times[base], strict=True))
        rows.append(
            f"{n:<24} {med * 1e3:>9.1f} {med / b_med:>6.3f} {high * 1e3:>8.1f} {high / b_high:>6.3f} "
            f"{mean * 1e3:>8.1f} {mean / b_mean:>6.3f} {paired:>7.3f} {work * 1e3:>7.0f} {work / b_work:>6.3f}"
        )
    return rows


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small", help="model preset (the reference model is `small`)")
    p.add_argument("--ranks", type=int, default=6)
    p.add_argument(
        "--shard", type=int, default=2, help="the HSDP mesh's shard dimension (ranks/shard replicas)"
    )
    p.add_argument("--cadence", type=int, default=10, help="the vote's and the checkpoints' cadence")
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant (rounded up to a cadence)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    p.add_argument("--fsdp2", action="store_true", help="add the two FSDP2 variants (a third more time)")
    p.add_argument("--verbose", action="store_true", help="show rank 0's log and each round's times")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.ranks % args.shard or args.ranks // args.shard < 2:
        p.error(f"--ranks {args.ranks} must be a multiple of --shard {args.shard}, with 2 replicas or more")

    rounds = math.ceil(args.steps / args.cadence) * args.cadence  # whole cadences: one vote and save in each
    command = " ".join(["python", "bench/bench_sharded.py", *sys.argv[1:]])
    load_before, started = load(), dt.datetime.now(dt.UTC)
    with tempfile.TemporaryDirectory(prefix="bench-sharded-") as tmp:
        out = Path(tmp) / "times.json"
        wargs = [sys.executable, str(Path(__file__).resolve()), "--worker", "--run-dir", tmp, "--out", str(out),
                 "--model", args.model, "--shard", str(args.shard), "--cadence", str(args.cadence),
                 "--rounds", str(rounds), "--warmup", str(args.warmup)]  # fmt: skip
        if args.fsdp2:
            wargs.append("--fsdp2")
        if args.verbose:
            wargs.append("--verbose")
        t0 = time.monotonic()
        rcs = run_ranks(wargs, args.ranks, verbose=args.verbose)
        wall = time.monotonic() - t0
        if any(rcs) or not out.exists():
            print(f"benchmark workers failed: exit codes {rcs}", file=sys.stderr)
            return 1
        result = json.loads(out.read_text())
    cpus = os.cpu_count() or 1
    print(f"command: {command}")
    print(f"date: {started:%Y-%m-%d %H:%M} UTC; torch {result['torch']}; {wall:.0f} s in all")
    fsdp2 = f", FSDP2 mesh {args.ranks} shard" if args.fsdp2 else ""
    print(f"model {args.model}: {result['params']:,} parameters; {args.ranks} gloo ranks on {cpus} CPUs; HSDP mesh "
          f"{args.ranks // args.shard} replicate x {args.shard} shard{fsdp2}; "
          f"{rounds} timed steps per variant, interleaved step by step, after {args.warmup} warm-up step(s) each")  # fmt: skip
    print(f"load average before: {load_before}; after: {load()}")
    if args.ranks > cpus:
        print(f"note: {args.ranks} ranks oversubscribe {cpus} CPU cores: absolute times are this host's contention; "
              "the ratios, measured side by side, are the figure")  # fmt: skip
    print("ratio: against the unguarded loop on the same mesh (hsdp, fsdp2); ms: a step's wall time, the mean "
          "over ranks; CPU ms: the CPU time of a step, summed over ranks (mean over steps)")  # fmt: skip
    for row in table(result):
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
