"""What the in-loop SDC checks cost: step time with and without them, side by side in one run.

    python bench/bench_checks.py [--model small] [--ranks 4] [--cadence 10] [--rounds 3]

Starts `--ranks` gloo ranks on this host (one process each, the reference trainer's own loop) and, in
the same processes, times windows of `--cadence` steps under each configuration: no checks, each check
alone, and all three at the cadence. The configurations are interleaved round by round, so drift (other
load, warm-up) hits all of them alike. Then, in this process, fingerprint (xxh3-64) throughput against
memcpy throughput over the same bytes (the reference model's flat gradient, and 32 MiB).

Target: all checks at the default cadence cost at most 1 + 1/cadence + 0.01 of an unchecked step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ("none", "finite", "recompute", "weight_vote", "all")


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from training.checks import build_checks
    from training.config import CheckConfig, TrainConfig, model_preset
    from training.loop import Trainer

    cfg = TrainConfig(
        run="bench", run_dir=Path(args.run_dir), steps=10**9, model=model_preset(args.model), use_store=False
    )
    trainer = Trainer(cfg, ())
    checks = {
        "none": (),
        "finite": ("finite",),
        "recompute": ("recompute",),
        "weight_vote": ("weight_vote",),
        "all": ("finite", "recompute", "weight_vote"),
    }
    step = 0
    for _ in range(args.warmup):
        step += 1
        trainer.step(step)
    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for i in range(args.rounds):
        for name in CONFIGS[i % len(CONFIGS) :] + CONFIGS[: i % len(CONFIGS)]:  # rotate: no fixed order bias
            trainer.checks = build_checks(
                CheckConfig(checks=checks[name], recompute_every=args.cadence, vote_every=args.cadence)
            )
            # `cadence` consecutive steps hold exactly one audit step and one vote step.
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.cadence):
                step += 1
                _, _, failed = trainer.step(step)
                assert failed is None, f"false alert in the benchmark at step {step}: {failed}"
            dist.barrier()
            times[name].append((time.perf_counter() - t0) / args.cadence)
            if trainer.rank == 0:
                print(f"  {name}: {times[name][-1] * 1e3:.1f} ms/step", file=sys.stderr, flush=True)
    if trainer.rank == 0:
        Path(args.out).write_text(json.dumps({"times": times, "params": trainer.n, "world": trainer.world}))
    trainer.checks = []
    trainer._close()


def fingerprint_vs_memcpy(nbytes_list: list[int], repeats: int = 20) -> list[dict[str, float]]:
    import torch

    from training.fingerprint import fingerprint_tensor

    out = []
    for nbytes in nbytes_list:
        t = torch.randn(nbytes // 4)
        dst = torch.empty_like(t)
        dst.copy_(t)  # touch the destination pages before timing
        fingerprint_tensor(t)
        fp_s, cp_s = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fingerprint_tensor(t)
            fp_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            dst.copy_(t)
            cp_s.append(time.perf_counter() - t0)
        fp, cp = min(fp_s), min(cp_s)
        out.append({"bytes": nbytes, "fingerprint_GBps": nbytes / fp / 1e9, "memcpy_GBps": nbytes / cp / 1e9})
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small", help="model preset (the reference model is `small`)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--cadence", type=int, default=10, help="audit and vote cadence (the default: 10)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--verbose", action="store_true", help="show rank 0's log and per-window times")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0

    command = " ".join(["python", "bench/bench_checks.py", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="bench-checks-") as tmp:
        out = Path(tmp) / "times.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LONGRUN_FAULT"))}
        env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.ranks),
                   LONGRUN_NODE_NAMES=",".join(f"n{i + 1}" for i in range(args.ranks)))  # fmt: skip
        wargs = [sys.executable, str(Path(__file__).resolve()), "--worker", "--run-dir", tmp, "--out", str(out),
                 "--model", args.model, "--cadence", str(args.cadence), "--rounds", str(args.rounds),
                 "--warmup", str(args.warmup)]  # fmt: skip
        # SIGTERM (a timeout) must still reach the finally below, which kills the workers.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        procs = [
            subprocess.Popen(
                wargs,
                cwd=REPO,
                env=dict(env, RANK=str(r), LOCAL_RANK="0"),
                stderr=None if r == 0 and args.verbose else subprocess.DEVNULL,
            )
            for r in range(args.ranks)
        ]
        try:
            rcs = [proc.wait(timeout=3600) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
        if any(rcs) or not out.exists():
            print(f"benchmark workers failed: exit codes {rcs}", file=sys.stderr)
            return 1
        result = json.loads(out.read_text())
    times = result["times"]
    base = statistics.median(times["none"])
    target = 1 + 1 / args.cadence + 0.01
    print(f"command: {command}")
    print(f"model {args.model}: {result['params']:,} parameters, {result['world']} gloo ranks on {os.cpu_count()} "
          f"CPUs, cadence {args.cadence}, {args.rounds} interleaved rounds of {args.cadence} steps")  # fmt: skip
    # On a shared machine noise only adds time: the best round is a fair estimate too; both are shown.
    best = min(times["none"])
    print(f"{'checks':<12} {'median ms':>10} {'ratio':>7} {'best ms':>9} {'ratio':>7}   per-round ms")
    for name in CONFIGS:
        med, low = statistics.median(times[name]), min(times[name])
        rounds = " ".join(f"{t * 1e3:.1f}" for t in times[name])
        print(
            f"{name:<12} {med * 1e3:>10.1f} {med / base:>7.3f} {low * 1e3:>9.1f} {low / best:>7.3f}   {rounds}"
        )
    for label, ratio in (
        ("median", statistics.median(times["all"]) / base),
        ("best", min(times["all"]) / best),
    ):
        verdict = "MET" if ratio <= target else "NOT MET"
        print(f"all checks at cadence {args.cadence} ({label}): x{ratio:.3f} of an unchecked step; "
              f"target <= {target:.3f}: {verdict}")  # fmt: skip
    print("fingerprint (xxh3-64) vs memcpy, same bytes, one thread, best of 20:")
    for row in fingerprint_vs_memcpy([result["params"] * 4, 32 << 20]):
        print(f"  {row['bytes'] / 2**20:7.1f} MiB: fingerprint {row['fingerprint_GBps']:6.2f} GB/s, memcpy "
              f"{row['memcpy_GBps']:6.2f} GB/s, ratio {row['fingerprint_GBps'] / row['memcpy_GBps']:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
