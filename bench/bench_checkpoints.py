"""Checkpoint benchmark: training stall per checkpoint (async saver vs synchronous torch.save, same run),
upload throughput (our S3 store vs a raw boto3 put of the same bytes), and validation time per GB.

Uses the S3 endpoint the environment names (`eval "$(longrun stack env)"`), else starts SeaweedFS in a
temporary state dir and stops it at the end. Prints the command that produced the numbers.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)

import torch  # noqa: E402

from training.checkpoint.saver import CheckpointSaver  # noqa: E402
from training.checkpoint.settings import SaverSettings  # noqa: E402
from training.store.s3 import S3Store  # noqa: E402

BENCH_PORT_BASES = (21650, 21500, 21350)  # below the default stack (21800) and the test slots (22000+)


@contextmanager
def s3_env() -> Iterator[dict[str, str]]:
    if os.environ.get("AWS_ENDPOINT_URL") and os.environ.get("LONGRUN_BUCKET"):
        yield dict(os.environ)
        return
    from longrun.stack.layout import Layout, ports_in_use
    from longrun.stack.stack import Stack

    with tempfile.TemporaryDirectory(prefix="longrun-bench-") as tmp:
        base = next(
            (
                b
                for b in BENCH_PORT_BASES
                if not ports_in_use(Layout(state_dir=Path(tmp), port_base=b).all_ports())
            ),
            None,
        )
        if base is None:
            raise SystemExit(f"no free port range among {BENCH_PORT_BASES} for a benchmark SeaweedFS")
        stack = Stack(Path(tmp), port_base=base)
        stack.up(["s3"], say=lambda _line: None)
        try:
            env = stack.s3.env()
            os.environ.update(env)  # the saver's NVRx worker rebuilds the store from the environment
            yield env
        finally:
            stack.down(["s3"], say=lambda _line: None)


def make_state(mib: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A model state of `mib` MiB in 4 MiB float32 tensors and an Adam-shaped optimizer state (2x)."""
    g = torch.Generator().manual_seed(0)
    n = max(1, mib // 4)
    model = {f"layer{i}.weight": torch.randn(1 << 20, generator=g) for i in range(n)}
    optim = {
        "state": {
            i: {"exp_avg": torch.randn(1 << 20, generator=g), "exp_avg_sq": torch.rand(1 << 20, generator=g)}
            for i in range(n)
        },
        "param_groups": [{"lr": 1e-3, "params": list(range(n))}],
    }
    return model, optim


def train_step(w: torch.Tensor) -> None:
    x = torch.randn(256, w.shape[0])
    (x @ w).relu_().sum()


def bench_stall(
    env: dict[str, str], mib: int, saves: int, every: int, tmp: Path, nice: int
) -> dict[str, float]:
    model, optim = make_state(mib)
    work = torch.randn(1024, 1024)
    store = S3Store(bucket=env["LONGRUN_BUCKET"], endpoint_url=env["AWS_ENDPOINT_URL"])
    run = f"bench-{int(time.time())}"

    base = []
    for _ in range(30):
        t = time.perf_counter()
        train_step(work)
        base.append(time.perf_counter() - t)
    step_s = statistics.median(base)

    sync, sync_cpu = [], []
    for i in range(saves):
        d = tmp / f"sync-{i}"
        d.mkdir()
        t, c = time.perf_counter(), time.process_time()
        for name, obj in (("model.pt", model), ("optim.pt", optim)):
            with open(d / name, "wb") as f:
                torch.save(obj, f)
                f.flush()
                os.fsync(f.fileno())
        sync.append(time.perf_counter() - t)
        sync_cpu.append(time.process_time() - c)

    settings = SaverSettings(writer="nvrx", wait_timeout_s=600, background_nice=nice)
    saver = CheckpointSaver(run=run, run_dir=tmp / "run", store=store, settings=settings)
    # Warm NVRx's worker (a spawned process importing torch) outside the measurement, as a long run would.
    saver.save(step=0, model_state={"w": torch.zeros(1)})
    saver.wait(300)
    steps_during, slow = 0, 0.0
    step = 1
    async_cpu = []
    for _ in range(saves):
        c = time.process_time()  # the writer thread is idle here: this is the caller's CPU time
        saver.save(step=step, model_state=model, optim_state=optim)
        async_cpu.append(time.process_time() - c)
        for _ in range(every):
            t = time.perf_counter()
            train_step(work)
            dt = time.perf_counter() - t
            if saver.pending():
                steps_during += 1
                slow += max(0.0, dt - step_s)
            step += 1
        saver.wait(600)  # one checkpoint in flight at a time, as with a sane cadence
    saver.close()
    assert not saver.failures, saver.failures
    async_stall = statistics.median(saver.stall_s[1:])
    save_s = statistics.median(r.duration_s for r in saver.results[1:])
    return {
        "run": run,  # type: ignore[dict-item]
        "bytes": saver.results[-1].nbytes,
        "step_s": step_s,
        "sync_stall_s": statistics.median(sync),
        "sync_cpu_s": statistics.median(sync_cpu),
        "async_cpu_s": statistics.median(async_cpu),
        "async_stall_s": async_stall,
        "async_slowdown_s": slow / saves,
        "async_background_s": save_s,
        "steps_during_save": steps_during / saves,
    }


def bench_upload(env: dict[str, str], mib: int, repeats: int, tmp: Path) -> dict[str, float]:
    import boto3

    data = os.urandom(mib << 20)
    path = tmp / "upload.bin"
    path.write_bytes(data)
    store = S3Store(bucket=env["LONGRUN_BUCKET"], endpoint_url=env["AWS_ENDPOINT_URL"])
    raw = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
    ours, theirs = [], []
    for i in range(repeats):
        t = time.perf_counter()
        store.put_file(f"bench/upload-ours-{i}", path)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        raw.put_object(Bucket=env["LONGRUN_BUCKET"], Key=f"bench/upload-raw-{i}", Body=data)
        theirs.append(time.perf_counter() - t)
    for i in range(repeats):
        store.delete(f"bench/upload-ours-{i}")
        store.delete(f"bench/upload-raw-{i}")
    return {"mib": mib, "ours_s": statistics.median(ours), "raw_s": statistics.median(theirs)}


def bench_validate(env: dict[str, str], run: str, step: int, repeats: int) -> dict[str, float]:
    from longrun.checkpoints.validate import validate

    store = S3Store(bucket=env["LONGRUN_BUCKET"], endpoint_url=env["AWS_ENDPOINT_URL"])
    recs = [validate(store, run, step, write=False) for _ in range(repeats)]
    assert all(r["ok"] for r in recs), recs[0]["errors"]
    return {"bytes": recs[0]["bytes"], "s": statistics.median(r["duration_s"] for r in recs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64, help="model state MiB (the optimizer state is 2x)")
    p.add_argument("--saves", type=int, default=3, help="checkpoints per mode")
    p.add_argument("--every", type=int, default=40, help="training steps between checkpoints")
    p.add_argument("--upload-mib", type=int, default=128, help="bytes per upload measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nice", type=int, default=10, help="SaverSettings.background_nice")
    args = p.parse_args(argv)
    print(
        "command:",
        shlex.join([Path(sys.executable).name, "bench/bench_checkpoints.py", *(argv or sys.argv[1:])]),
    )
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.1f} (numbers from a loaded host are not comparable)"
    )
    with s3_env() as env, tempfile.TemporaryDirectory(prefix="longrun-bench-ckpt-") as tmp:
        print(f"store: s3://{env['LONGRUN_BUCKET']} at {env['AWS_ENDPOINT_URL']}")
        st = bench_stall(env, args.mib, args.saves, args.every, Path(tmp), args.nice)
        gb = st["bytes"] / 1e9
        print(
            f"\n[stall] background_nice {args.nice}, checkpoint {st['bytes'] / 2**20:.0f} MiB, train step {st['step_s'] * 1e3:.1f} ms, {args.saves} saves each"
        )
        print(f"  synchronous torch.save (+fsync) holds the step : {st['sync_stall_s'] * 1e3:8.1f} ms")
        print(f"  async save() holds the step (CPU snapshot)     : {st['async_stall_s'] * 1e3:8.1f} ms")
        print(
            f"  ratio async/sync                               : {st['async_stall_s'] / st['sync_stall_s']:8.3f}"
        )
        print(
            f"  the same in CPU time (less sensitive to load)  : {st['async_cpu_s'] * 1e3:.1f} / "
            f"{st['sync_cpu_s'] * 1e3:.1f} ms = {st['async_cpu_s'] / max(st['sync_cpu_s'], 1e-9):.3f}"
        )
        print(
            f"  + slower steps while the background save runs  : {st['async_slowdown_s'] * 1e3:8.1f} ms per checkpoint"
            f" over {st['steps_during_save']:.0f} steps"
        )
        print(
            f"  ratio (stall + slowdown)/sync                  : {(st['async_stall_s'] + st['async_slowdown_s']) / st['sync_stall_s']:8.3f}"
        )
        print(f"  background write+hash+upload+manifest          : {st['async_background_s']:8.2f} s")

        up = bench_upload(env, args.upload_mib, args.repeats, Path(tmp))
        mb = up["mib"] * 2**20 / 1e6
        print(f"\n[upload] {up['mib']} MiB, median of {args.repeats}")
        print(f"  S3Store.put_file (sha256 + multipart + head)   : {mb / up['ours_s']:8.1f} MB/s")
        print(f"  raw boto3 put_object of the same bytes          : {mb / up['raw_s']:8.1f} MB/s")
        print(f"  ratio ours/raw throughput                       : {up['raw_s'] / up['ours_s']:8.3f}")

        va = bench_validate(env, str(st["run"]), args.saves * args.every - args.every + 1, args.repeats)
        print(
            f"\n[validate] {va['bytes'] / 2**20:.0f} MiB checkpoint from S3 (download, sha256, load, finite, fingerprints)"
        )
        print(f"  {va['s']:.2f} s -> {va['s'] / (va['bytes'] / 1e9):.2f} s per GB")
        del gb
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
