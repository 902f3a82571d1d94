"""Section 1 of bench/gpu/device_check.py: fingerprint throughput; device fingerprints equal the CPU's."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from figures import emit, timer

from training.fingerprint import device as dfp
from training.fingerprint.host import fingerprint_tensor as xxh3


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
    # Equality: the device's value == the definition's, computed with Python ints from the CPU copy's bytes
    # (training.fingerprint.device.reference_fingerprint): torch kernels on either device against an
    # independent implementation, eager and compiled where built. A CPU-vs-CPU comparison would prove
    # nothing on the dry run; this one tests the same claim there and on a device.
    same = []
    for name, (t, view) in equality_inputs().items():
        logical = view(t).contiguous()
        want = dfp.reference_fingerprint(logical.reshape(-1).view(torch.uint8).numpy().tobytes(),
                                         logical.dtype, tuple(logical.shape))  # fmt: skip
        on_dev = view(t.to(dev))
        got = [dfp.fingerprint_tensor(on_dev)]
        if rs is not None:
            got.append(int(dfp.fingerprint_tensor_device(on_dev, row_sums=rs).item()) & ((1 << 64) - 1))
        same.append(all(g == want for g in got))
        if not same[-1]:
            emit("fp.equal_mismatch", name, ok=False, want=f"{want:016x}", device=[f"{g:016x}" for g in got])
    if dev.type != "cpu":  # a large tensor, too large for the Python reference: the device against CPU torch
        big = x[: min(x.numel(), 1 << 24)]
        same.append(dfp.fingerprint_tensor(big) == dfp.fingerprint_tensor(big.cpu()))
    emit("fp.device_equals_cpu", all(same), goal="true", ok=all(same), tensors=len(same))
