"""Sections 2 and 3 of bench/gpu/device_check.py: a model's snapshot stall and the checks' cost per step."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from figures import emit, timer

from training.fingerprint import device as dfp


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
    from training.checkpoint.load import load_checkpoint
    from training.checkpoint.saver import CheckpointSaver
    from training.checkpoint.settings import SaverSettings
    from training.store.local import LocalDirStore

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
            from training.fingerprint.host import combine, fingerprint_state

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
