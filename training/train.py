"""The reference trainer: a small transformer LM on synthetic data, data-parallel, with the three SDC
checks, fault injection, async checkpoints, and progress/check/alert records.

    python -m training.train --run-dir runs/demo --steps 40 --model tiny            # one process
    LONGRUN_NODE_NAMES=n1,n2,n3,n4 python -m torch.distributed.run --nproc-per-node 4 \
        -m training.train --run-dir runs/demo --steps 40 --recompute-every 5 --vote-every 5

Data parallelism is done by hand rather than with DDP: the local gradients are concatenated into one
flat buffer (plus two slots: the finite check's flag and the loss), all-reduced once, and averaged. So
the checks see exactly the local, pre-all-reduce gradient, the non-finite flag costs no extra collective,
and the bits are the same on every rank.

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

from training import schema
from training.config import PRESETS, CheckConfig, TrainConfig, model_preset
from training.faults import Fault, FaultSpecError, faults_from

log = logging.getLogger("training.train")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longrun-train", description=__doc__.split("\n\n")[0])
    # `--run` is the old spelling, kept for direct starts; behind torchrun or ft_launcher it reads as an
    # ambiguous abbreviation of their `--run-path`, so launchers pass `--run-name` (docs/contracts.md).
    p.add_argument(
        "--run-name", "--run", dest="run", metavar="NAME", help="run name (default: the run dir's name)"
    )
    p.add_argument("--run-dir", required=True, type=Path, help="local directory for records")
    p.add_argument("--steps", type=int, required=True, help="train up to this step")
    p.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint cadence (0: none)")
    p.add_argument(
        "--recompute-every", type=int, default=10, help="cross-node recompute audit cadence (0: off)"
    )
    p.add_argument("--vote-every", type=int, default=10, help="weight vote cadence (0: only before saves)")
    p.add_argument("--fault", action="append", default=[], metavar="KIND:STEP:TARGET", help="inject a fault")
    p.add_argument("--resume-from", help="checkpoint to resume from: a local directory or a store prefix")
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS), help="model preset")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
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
        default=0.0,
        help="warm standby of a kept job's next attempt: wait this long for its directive (training.standby)",
    )
    return p


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, tuple[Fault, ...]]:
    checks = () if args.checks.strip() in ("", "none") else tuple(c.strip() for c in args.checks.split(","))
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
        threads=args.threads,
        resume_from=args.resume_from,
        use_store=not args.no_store,
        store_flush_every=args.store_flush_every,
        collective_timeout_s=args.collective_timeout,
        await_directive_s=args.await_directive_s,
    )
    return cfg, faults_from(args.fault)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg, faults = config_from_args(args)
    except (ValueError, FaultSpecError) as e:
        print(f"longrun-train: {e}", file=sys.stderr)
        return 2
    # Pin the knobs the bits depend on before torch does any work.
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.threads))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    from training.loop import SetupError, Trainer
    from training.standby import NotDirected

    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s r{rank} %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        trainer = Trainer(cfg, faults)
    except (SetupError, NotDirected) as e:
        log.error("%s", e)
        return 2
    return trainer.run()


if __name__ == "__main__":
    sys.exit(main())
