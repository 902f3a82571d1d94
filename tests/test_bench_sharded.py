"""bench/bench_sharded.py at a tiny size: four real gloo ranks (HSDP 2 x 2 and FSDP2 over 4), every variant
trained side by side without a false alert, and the table has a row per variant with finite times and the
unguarded loops at ratio 1 (the full bench: `python bench/bench_sharded.py`, docs/checks.md). No
wall-clock thresholds: this host's times say nothing about the guard."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_sharded.py"
VARIANTS = [
    "hsdp",
    "guard:none",
    "guard:finite@1",
    "guard:vote@1",
    "guard:recompute@1",
    "guard:default",
    "guard:default+ckpt",
    "guard:default+ckpt-sync",
    "fsdp2",
    "fsdp2 guard:default",
]


def test_tiny_bench_prints_a_row_per_variant() -> None:
    args = ["--model", "tiny", "--ranks", "4", "--cadence", "2", "--steps", "2", "--warmup", "1", "--fsdp2"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "command: python bench/bench_sharded.py " + " ".join(args)
    assert any(line.startswith("load average before: ") for line in lines)
    header = next(i for i, line in enumerate(lines) if line.startswith("variant "))
    rows = {}
    for line in lines[header + 1 :]:
        name, *numbers = line.rsplit(None, 9)
        rows[name] = [float(x) for x in numbers]
    assert list(rows) == VARIANTS
    for name, numbers in rows.items():  # median, ratio, p95, ratio, mean, ratio, paired, CPU, ratio
        assert len(numbers) == 9 and all(math.isfinite(x) and x > 0 for x in numbers), (name, numbers)
    for unguarded in ("hsdp", "fsdp2"):  # the loops every ratio is taken against
        assert [rows[unguarded][i] for i in (1, 3, 5, 6, 8)] == [1.0] * 5, rows[unguarded]
