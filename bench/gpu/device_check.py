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
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

import torch  # noqa: E402

from training import fingerprint_device as dfp  # noqa: E402
from training.fingerprint import fingerprint_tensor as xxh3  # noqa: E402

ROWS: list[dict[str, Any]] = []


def emit(name: str, value: Any, *, goal: str | None = None, ok: bool | None = None, **kw: Any) -> None:
    row = {"name": name, "value": value, "goal": goal, "ok": ok, **kw}
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def timer(dev: torch.device, fn: Callable[[], Any], *, warmup: int = 2, repeat: int = 5) -> float:
    """Median seconds of fn() (device work included)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---- 1. fingerprint throughput and GPU == CPU --------------------------------------------------------


def equality_inputs() -> dict[str, tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]]:
    """name -> (a CPU tensor, the view taken of it on each device): dtypes, odd lengths, non-contiguous."""
    g = torch.Generator().manual_seed(7)
    base = torch.randn(3 * dfp.ROW_WORDS + 13, generator=g)
    same = lambda t: t  # noqa: E731
    return {
        "f32": (base, same),
        "bf16_odd": (base[:-2].to(torch.bfloat16), same),
        "f16": (base.to(torch.float16), same),
        "f64": (base.to(torch.float64), same),
        "i64": (torch.randint(-(2**62), 2**62, (1001,), generator=g), same),
        "u8_odd": (torch.randint(0, 256, (4099,), generator=g, dtype=torch.uint8), same),
        "bool": (torch.rand(77, generator=g) > 0.5, same),
        "transposed": (torch.randn(129, 65, generator=g), lambda t: t.T),
        "strided": (base, lambda t: t[1::3]),
        "unaligned": (base.to(torch.bfloat16), lambda t: t[1:]),
        "signed_zero_nan": (torch.tensor([0.0, -0.0, float("nan")]), same),
        "scalar": (torch.tensor(3.5), same),
    }


def fingerprint_section(dev: torch.device, *, nbytes: int, compile_: bool) -> None:
    x = torch.randn(nbytes // 4, device=dev)
    y = torch.empty_like(x)
    t_copy = timer(dev, lambda: y.copy_(x))
    t_eager = timer(dev, lambda: dfp.fingerprint_tensor_device(x))
    emit("fp.bytes", nbytes)
    emit("fp.copy_s", t_copy)
    emit("fp.dfp_eager_s", t_eager)
    goal = ">= 0.5 (GPU)" if dev.type == "cuda" else None
    r_eager = t_copy / t_eager
    emit("fp.dfp_eager_vs_copy", round(r_eager, 3), goal=goal, ok=(r_eager >= 0.5) if goal else None)
    rs = None
    if compile_:
        try:
            rs = dfp.compiled_row_sums()
            t0 = time.perf_counter()
            dfp.fingerprint_tensor_device(x, row_sums=rs).item()
            emit("fp.compile_s", round(time.perf_counter() - t0, 1))
            t_comp = timer(dev, lambda: dfp.fingerprint_tensor_device(x, row_sums=rs))
            r_comp = t_copy / t_comp
            emit("fp.dfp_compiled_s", t_comp)
            emit("fp.dfp_compiled_vs_copy", round(r_comp, 3), goal=goal, ok=(r_comp >= 0.5) if goal else None)
        except Exception as e:  # no compiler here, or inductor refuses: eager is the reference anyway
            rs = None
            emit("fp.dfp_compiled_vs_copy", None, ok=None, skipped=f"torch.compile failed: {e!r}"[:300])
    if dev.type == "cpu":
        t_x = timer(dev, lambda: xxh3(x))
        emit("fp.xxh3_s", t_x)
        emit("fp.xxh3_vs_copy", round(t_copy / t_x, 3))
        emit(
            "fp.dfp_eager_vs_xxh3", round(t_x / t_eager, 3), note="CPU: < 1 means xxh3 is faster (used there)"
        )
    # Equality: the device's value == the CPU's for the same bytes (eager, and compiled where built).
    same = []
    for name, (t, view) in equality_inputs().items():
        cpu = dfp.fingerprint_tensor(view(t))
        on_dev = view(t.to(dev))
        got = [dfp.fingerprint_tensor(on_dev)]
        if rs is not None:
            got.append(int(dfp.fingerprint_tensor_device(on_dev, row_sums=rs).item()) & ((1 << 64) - 1))
        same.append(all(g == cpu for g in got))
        if not same[-1]:
            emit("fp.equal_mismatch", name, ok=False, cpu=f"{cpu:016x}", device=[f"{g:016x}" for g in got])
    big = x[: min(x.numel(), 1 << 24)]
    same.append(dfp.fingerprint_tensor(big) == dfp.fingerprint_tensor(big.cpu()))
    emit("fp.device_equals_cpu", all(same), goal="true", ok=all(same), tensors=len(same))


# ---- 2. and 3. the model: snapshot stall, checks per step -----------------------------------------------


def model_config(size: str) -> Any:
    from training.config import ModelConfig

    if size == "1b":  # ~1.0e9 parameters: 12 * 18 * 2048^2 + 2 * 32000 * 2048
        return ModelConfig(
            vocab_size=32000, d_model=2048, n_layers=18, n_heads=16, seq_len=1024, batch_size=4
        )
    return ModelConfig(vocab_size=1024, d_model=128, n_layers=2, n_heads=4, seq_len=64, batch_size=4)


def build(dev: torch.device, size: str) -> tuple[Any, Any, Any]:
    from training.model import build_model

    cfg = model_config(size)
    model = build_model(cfg, seed=0, device=dev)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    return cfg, model, optim


def batch_for(cfg: Any, dev: torch.device, step: int, rank: int = 0) -> torch.Tensor:
    from training.data import micro_batch

    return micro_batch(cfg, seed=0, step=step, rank=rank).to(dev)


def step_fn(cfg: Any, model: Any, optim: Any, dev: torch.device) -> Callable[[], None]:
    counter = [0]
    amp = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if dev.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )

    def step() -> None:
        counter[0] += 1
        optim.zero_grad(set_to_none=False)  # first: the gradients of the last step stay for the checks
        with amp:
            loss = model.loss(batch_for(cfg, dev, counter[0]))
        loss.backward()
        optim.step()

    return step


def snapshot_section(
    dev: torch.device, model: Any, optim: Any, step: Callable[[], None], *, writer: str, saves: int
) -> None:
    from training.checkpoint_load import load_checkpoint
    from training.checkpointing import CheckpointSaver, SaverSettings
    from training.store import LocalDirStore

    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state_bytes += sum(
        t.numel() * t.element_size() for s in optim.state_dict()["state"].values() for t in s.values()
        if isinstance(t, torch.Tensor)
    )  # fmt: skip
    emit("snap.params", sum(p.numel() for p in model.parameters()))
    emit("snap.state_bytes", state_bytes)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        t0 = time.perf_counter()
        torch.save({"model": model.state_dict(), "optim": optim.state_dict()}, Path(tmp, "sync.pt"))
        t_sync = time.perf_counter() - t0
        emit("snap.sync_save_s", round(t_sync, 3), note="torch.save straight from the device to local disk")
        Path(tmp, "sync.pt").unlink()
        settings = SaverSettings(writer=writer)  # type: ignore[arg-type]
        with CheckpointSaver(run="gpu-check", run_dir=Path(tmp, "run"), store=LocalDirStore(Path(tmp, "store")),
                             settings=settings) as saver:  # fmt: skip
            for i in range(saves):
                step()
                if dev.type == "cuda":
                    torch.cuda.synchronize()  # the stall is the save's, not the step's queued kernels
                saver.save(
                    step=i + 1, model_state=model.state_dict(), optim_state=optim.state_dict(), extra={"i": i}
                )
                if not saver.wait():
                    emit("snap.saver_wait", False, ok=False)
                    return
                for old in Path(tmp).glob(f"**/step-{i:08d}"):  # keep the disk to one checkpoint
                    shutil.rmtree(old)
            results, stalls = list(saver.results), list(saver.stall_s)
        ok = bool(results) and all(r.ok for r in results)
        emit("snap.saves_ok", ok, goal="true", ok=ok, writer=results[-1].writer if results else None,
             errors=[r.error for r in results if r.error])  # fmt: skip
        emit("snap.stall_s", [round(s, 4) for s in stalls], note="first save allocates the pinned buffers")
        reuse = statistics.median(stalls[1:]) if len(stalls) > 1 else stalls[0]
        ratio = reuse / t_sync
        goal = "<= 0.10 (GPU)" if dev.type == "cuda" else None
        emit("snap.stall_vs_sync_save", round(ratio, 4), goal=goal, ok=(ratio <= 0.10) if goal else None)
        # What was written equals what is on the device: dfp of the stored weights == dfp on the device.
        ck = load_checkpoint(str(Path(tmp, "run", "checkpoints", f"step-{saves:08d}")), store=None)
        _, dev_fp = dfp.fingerprint_state(model.state_dict())
        _, disk_fp = dfp.fingerprint_state(ck.model_state)
        emit("snap.saved_equals_device", dev_fp == disk_fp, goal="true", ok=dev_fp == disk_fp)


def checks_section(dev: torch.device, cfg: Any, model: Any, optim: Any, step: Callable[[], None]) -> None:
    from training.config import CheckConfig

    defaults = CheckConfig()
    t_step = timer(dev, step, warmup=1, repeat=5)
    emit("checks.step_s", t_step)
    params = [p for p in model.parameters()]
    n = sum(p.numel() for p in params)
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # the trainer keeps gradients in one buffer

    def finite() -> None:
        bool(torch.isfinite(flat.sum()).item())
        bool(torch.isfinite(torch.linalg.vector_norm(flat)).item())  # norm: computed for clipping anyway

    def recompute() -> None:  # the extra micro-batch: forward + backward, and two gradient fingerprints
        amp = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if dev.type == "cuda"
            else torch.autocast("cpu", enabled=False)
        )
        with amp:
            loss = model.loss(batch_for(cfg, dev, 1, rank=1))
        grads = torch.autograd.grad(loss, params)
        scratch = torch.cat([g.reshape(-1) for g in grads])
        dfp.fingerprint_where_it_lives(scratch)
        dfp.fingerprint_where_it_lives(flat)

    def vote() -> None:
        if dev.type == "cuda":
            _, _, combined = dfp.fingerprint_state_device(model.state_dict())
            combined.item()  # the 8 bytes that cross to the host (world size 1: no all-gather here)
        else:
            from training.fingerprint import combine, fingerprint_state

            combine(fingerprint_state(model.state_dict()))

    costs = {
        "finite": timer(dev, finite),
        "recompute": timer(dev, recompute, repeat=3),
        "vote": timer(dev, vote),
    }
    for k, v in costs.items():
        emit(f"checks.{k}_vs_step", round(v / t_step, 4))
    cadence = {"finite": 1, "recompute": defaults.recompute_every, "vote": defaults.vote_every}
    overhead = sum(costs[k] / max(cadence[k], 1) for k in costs) / t_step
    allowed = 0.01 + 1 / max(defaults.recompute_every, 1)
    goal = f"<= {allowed:.3f} (1% + 1/cadence)" if dev.type == "cuda" else None
    emit("checks.overhead_at_default_cadence", round(overhead, 4), goal=goal,
         ok=(overhead <= allowed) if goal else None, cadence=cadence, params=n)  # fmt: skip
    if dev.type == "cuda":  # the same vote with the compiled row sums (the vote uses eager today)
        try:
            rs = dfp.compiled_row_sums()
            state = model.state_dict()
            eager_fp = dfp.fingerprint_state_device(state)[2].item()
            same = dfp.fingerprint_state_device(state, row_sums=rs)[2].item() == eager_fp
            t_vc = timer(dev, lambda: dfp.fingerprint_state_device(state, row_sums=rs)[2].item())
            emit("checks.vote_compiled_vs_step", round(t_vc / t_step, 4), equal_to_eager=same,
                 ok=same, goal="true")  # fmt: skip
        except Exception as e:
            emit("checks.vote_compiled_vs_step", None, skipped=f"torch.compile failed: {e!r}"[:300])


# ---- 4. NVRx ----------------------------------------------------------------------------------------------


def nvrx_section(out: Path, *, dry_run: bool) -> None:
    import subprocess

    from training.nvrx import capabilities, parse_version

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


def table() -> None:
    print(f"\n{'figure':<40} {'value':<28} {'goal':<26} ok")
    for r in ROWS:
        value = r["value"]
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        ok = "" if r["ok"] is None else str(r["ok"])
        print(f"{r['name']:<40} {text[:28]:<28} {r['goal'] or '':<26} {ok}")


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
