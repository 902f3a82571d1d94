"""The GPU path, measured on one device: fingerprint throughput, GPU == CPU fingerprints, the CUDA
snapshot stall, the checks' cost per training step, and (bench/gpu/nvrx_check.py) NVRx.

    python bench/gpu/device_check.py --out DIR             # on a GPU (bench/gpu/run.sh runs this)
    python bench/gpu/device_check.py --dry-run --out DIR   # CPU, small sizes: CI runs this (tests/bench)

Every figure is a ratio of two timings taken the same way in the same process (CUDA events on a GPU,
perf_counter on CPU; median of repeats after a warm-up). Prints one JSON object per figure, then a table;
writes all of it to DIR/device_check.json. Exit 1 when a correctness check fails (goals missed are
reported, not fatal: they are what the run is for).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

import torch  # noqa: E402
from figures import ROWS, emit, table  # noqa: E402
from fingerprint_figures import fingerprint_section  # noqa: E402
from model_figures import build, checks_section, snapshot_section, step_fn  # noqa: E402

# ---- 4. NVRx ----------------------------------------------------------------------------------------------


def nvrx_section(out: Path, *, dry_run: bool) -> None:
    import subprocess

    from training.nvrx.adapter import capabilities, parse_version

    caps = capabilities()
    v = parse_version(caps.version) if caps.installed else (0, 0, 0)
    if dry_run or v < (0, 7, 0) or not torch.cuda.is_available():
        why = (
            "dry run"
            if dry_run
            else f"NVRx {caps.version or 'not installed'}"
            if v < (0, 7, 0)
            else "no CUDA"
        )
        emit(
            "nvrx", None, skipped=f"{why}: the NVRx 0.7 launches run on the device only (version rules below)"
        )
        launches = "none"
    else:
        launches = "all"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench/gpu/nvrx_check.py"), "--out", str(out / "nvrx"), "--launches", launches],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    for line in proc.stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        ok = row.pop("ok")
        emit(row.pop("check"), ok, goal="true" if ok is not None else None, ok=ok, **row)
    if proc.returncode != 0:
        emit("nvrx.check_rc", proc.returncode, ok=False, stderr_tail=proc.stderr[-1500:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "bench-gpu-out"))
    p.add_argument("--dry-run", action="store_true", help="CPU, small sizes, NVRx launches skipped")
    p.add_argument(
        "--fp-bytes", type=int, default=None, help="bytes fingerprinted (default 2 GiB, dry 8 MiB)"
    )
    p.add_argument("--model", choices=("1b", "small"), default=None, help="default 1b, dry small")
    p.add_argument("--compile", choices=("yes", "no", "auto"), default="auto", help="auto: on CUDA only")
    p.add_argument(
        "--writer", choices=("auto", "nvrx", "thread"), default=None, help="default auto, dry thread"
    )
    p.add_argument("--saves", type=int, default=3, help="checkpoint saves timed (the first allocates)")
    p.add_argument("--skip", default="", help="comma list of sections to skip: fp, snap, checks, nvrx")
    args = p.parse_args()
    # run.sh's time limit sends SIGTERM: end through the `finally` below, so the figures so far are kept.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print("no CUDA device: run with --dry-run for the CPU version", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    emit("env", platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
         device=torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
         date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), dry_run=args.dry_run)  # fmt: skip
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    try:
        if "fp" not in skip:
            nbytes = args.fp_bytes or ((2 << 30) if cuda else (8 << 20))
            compile_ = args.compile == "yes" or (args.compile == "auto" and cuda)
            fingerprint_section(dev, nbytes=nbytes, compile_=compile_)
        if not {"snap", "checks"} <= skip:
            cfg, model, optim = build(dev, args.model or ("1b" if cuda else "small"))
            step = step_fn(cfg, model, optim, dev)
            step()  # materialize gradients and the optimizer state
            if "checks" not in skip:
                checks_section(dev, cfg, model, optim, step)
            if "nvrx" not in skip:  # before the snapshot, the longest section: a time-out loses least
                nvrx_section(args.out, dry_run=args.dry_run)
                skip.add("nvrx")
            if "snap" not in skip:
                writer = args.writer or ("auto" if cuda else "thread")
                snapshot_section(dev, model, optim, step, writer=writer, saves=args.saves)
            del model, optim
        if "nvrx" not in skip:
            nvrx_section(args.out, dry_run=args.dry_run)
    finally:
        (args.out / "device_check.json").write_text(json.dumps(ROWS, indent=1, default=str))
        table()
    bad = [r["name"] for r in ROWS if r["ok"] is False and r["goal"] == "true"]
    if bad:
        print(f"\nFAILED correctness checks: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
