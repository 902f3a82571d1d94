"""The figures of bench/gpu/device_check.py: each printed as one JSON line and kept; the timer behind them."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

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


def table() -> None:
    print(f"\n{'figure':<40} {'value':<28} {'goal':<26} ok")
    for r in ROWS:
        value = r["value"]
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        ok = "" if r["ok"] is None else str(r["ok"])
        print(f"{r['name']:<40} {text[:28]:<28} {r['goal'] or '':<26} {ok}")
