"""The reference trainer: a small transformer LM on synthetic data, data-parallel, with the three SDC
checks, fault injection, async checkpoints, and progress/check/alert records.

    python -m training.train --run-dir runs/demo --steps 40 --model tiny            # one process
    LONGRUN_NODE_NAMES=n1,n2,n3,n4 python -m torch.distributed.run --nproc-per-node 4 \
        -m training.train --run-dir runs/demo --steps 40 --recompute-every 5 --vote-every 5

It is the first user of the public job-side API (training.api): the model, the optimizer, the data and
the loss function are its own; the guard owns the step order (DistributedDataParallel with longrun's
communication hook, the checks, saves, records, the verdict). Every flag defaults to the job environment
longrun's launch exports (LONGRUN_RUN_DIR, LONGRUN_STEPS, ...: docs/contracts.md), so the launch needs
no flags; a flag given wins.

Exit codes: 0 done; 93 (schema.EXIT_SDC_VERDICT) an SDC check reached a verdict (do not restart in
place; the alert record says why); 2 bad arguments, a non-deterministic set-up, or a standby never
directed here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from training.config import (
    ENV_AWAIT_DIRECTIVE_S,
    ENV_CHECKPOINT_EVERY,
    ENV_FAULTS,
    ENV_MODEL,
    ENV_PARALLELISM,
    ENV_RECOMPUTE_EVERY,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    ENV_RUN_NAME,
    ENV_SEED,
    ENV_STEPS,
    ENV_VOTE_EVERY,
    PARALLELISMS,
    PRESETS,
    CheckConfig,
    TrainConfig,
    checks_for_parallelism,
    env_float,
    env_int,
    model_preset,
    parallelism_from_env,
)
from training.faults import Fault, FaultSpecError, faults_from
from training.records import schema

log = logging.getLogger("training.train")


def build_parser() -> argparse.ArgumentParser:
    """The trainer's command line; every flag defaults to the job environment longrun's launch exports.

    Why one function: it is the argument table, one `add_argument` per flag in `--help` order."""
    p = argparse.ArgumentParser(prog="longrun-train", description=__doc__.split("\n\n")[0])
    # `--run` is the old spelling, kept for direct starts; behind torchrun or ft_launcher it reads as an
    # ambiguous abbreviation of their `--run-path`, so launchers pass `--run-name` (docs/contracts.md).
    env = os.environ
    p.add_argument(
        "--run-name", "--run", dest="run", metavar="NAME", default=env.get(ENV_RUN_NAME) or None,
        help=f"run name (default: ${ENV_RUN_NAME}, else the run dir's name)",
    )  # fmt: skip
    run_dir = env.get(ENV_RUN_DIR) or None
    p.add_argument(
        "--run-dir", required=run_dir is None, default=run_dir, type=Path,
        help=f"local directory for records (default: ${ENV_RUN_DIR})",
    )  # fmt: skip
    steps = env_int(env, ENV_STEPS, None)
    p.add_argument(
        "--steps",
        type=int,
        required=steps is None,
        default=steps,
        help=f"train up to this step (${ENV_STEPS})",
    )
    p.add_argument(
        "--checkpoint-every", type=int, default=env_int(env, ENV_CHECKPOINT_EVERY, 0),
        help="checkpoint cadence (0: none)",
    )  # fmt: skip
    p.add_argument(
        "--recompute-every", type=int, default=env_int(env, ENV_RECOMPUTE_EVERY, 10),
        help="cross-node recompute audit cadence (0: off)",
    )  # fmt: skip
    p.add_argument(
        "--vote-every", type=int, default=env_int(env, ENV_VOTE_EVERY, 10),
        help="weight vote cadence (0: only before saves)",
    )  # fmt: skip
    p.add_argument(
        "--fault", action="append", default=[], metavar="KIND:STEP:TARGET",
        help=f"inject a fault (besides ${ENV_FAULTS}, comma-separated)",
    )  # fmt: skip
    p.add_argument(
        "--resume-from", default=env.get(ENV_RESUME_FROM) or None,
        help="checkpoint to resume from: a local directory or a store prefix",
    )  # fmt: skip
    p.add_argument(
        "--model", default=env.get(ENV_MODEL) or "tiny", choices=sorted(PRESETS), help="model preset"
    )
    p.add_argument(
        "--seed", type=int, default=env_int(env, ENV_SEED, 0), help="seed of the weights and the data"
    )
    p.add_argument(
        "--parallelism", default=parallelism_from_env(env), choices=PARALLELISMS,
        help=f"ddp (whole replicas), fsdp (FSDP2 over every rank: no weight vote) or hsdp (FSDP2 within "
        f"a node, replicas across nodes) (default: ${ENV_PARALLELISM}, else ddp)",
    )  # fmt: skip
    p.add_argument(
        "--checks", default=",".join(schema.CHECKS), help="enabled checks, comma-separated, or 'none'"
    )
    p.add_argument("--on-verdict", default="exit", choices=("exit", "record"), help="what a verdict does")
    p.add_argument("--recompute-loss-rtol", type=float, default=0.0, help="0: exact (bitwise) recompute")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads per rank (pinned: bits depend on it)"
    )
    p.add_argument("--no-store", action="store_true", help="records to the run dir only")
    p.add_argument("--store-flush-every", type=int, default=20, help="flush check records every N steps")
    p.add_argument(
        "--collective-timeout", type=float, default=300.0, help="seconds before a collective fails"
    )
    p.add_argument(
        "--await-directive-s",
        type=float,
        default=env_float(env, ENV_AWAIT_DIRECTIVE_S, 0.0),
        help="warm standby of a kept job's next attempt: wait this long for its directive (training.spares.standby)",
    )
    return p


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, tuple[Fault, ...]]:
    checks = () if args.checks.strip() in ("", "none") else tuple(c.strip() for c in args.checks.split(","))
    runnable = checks_for_parallelism(args.parallelism, checks)
    if runnable != checks:
        log.warning(
            "parallelism %s cannot run %s; left out", args.parallelism, sorted(set(checks) - set(runnable))
        )
        checks = runnable
    cfg = TrainConfig(
        run=args.run or Path(args.run_dir).resolve().name,
        run_dir=Path(args.run_dir),
        steps=args.steps,
        model=model_preset(args.model),
        checks=CheckConfig(
            checks=checks,
            recompute_every=args.recompute_every,
            vote_every=args.vote_every,
            recompute_loss_rtol=args.recompute_loss_rtol,
            on_verdict=args.on_verdict,
        ),
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
        lr=args.lr,
        grad_clip=1.0,  # under FSDP2/HSDP by the whole model's norm too (training.api.sharding.clip_gradients)
        threads=args.threads,
        resume_from=args.resume_from,
        use_store=not args.no_store,
        store_flush_every=args.store_flush_every,
        collective_timeout_s=args.collective_timeout,
        await_directive_s=args.await_directive_s,
        parallelism=args.parallelism,
    )
    return cfg, faults_from(args.fault)


def train(cfg: TrainConfig, faults: tuple[Fault, ...]) -> int:
    """The reference trainer on the public API: its model, AdamW, synthetic data, next-token loss."""
    import torch

    from training.api.guard import Guard
    from training.data import SyntheticBatches
    from training.model import build_model, lm_loss

    def adamw(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01, foreach=False)

    guard = Guard(cfg, faults=faults)
    model = build_model(cfg.model, seed=cfg.seed, device=guard.device)
    data = SyntheticBatches(cfg.model, seed=cfg.seed, rank=guard.rank, device=guard.device)
    if cfg.parallelism == "ddp":
        guard.prepare(model, adamw(model.parameters()), loss_fn=lm_loss, state={"data": data})
    else:
        mesh = guard.device_mesh(cfg.parallelism)
        guard.prepare_sharded(model, mesh=mesh, make_optimizer=adamw, loss_fn=lm_loss, state={"data": data})
    return guard.run(data)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        cfg, faults = config_from_args(args)
    except (ValueError, FaultSpecError) as e:
        print(f"longrun-train: {e}", file=sys.stderr)
        return 2
    # Pin the knobs the bits depend on before torch does any work.
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.threads))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    from training.api.guard import SetupError
    from training.spares.standby import NotDirected

    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s r{rank} %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        return train(cfg, faults)
    except (SetupError, NotDirected) as e:
        log.error("%s", e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
