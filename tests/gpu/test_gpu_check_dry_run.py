"""bench/gpu/run.sh --dry-run: the device script end to end on CPU with small sizes, so it cannot rot
between device runs. No GPU here: the CUDA-only figures are measured by the same script on a device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_prints_every_figure_and_passes_its_checks(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "OUT": str(tmp_path)}
    proc = subprocess.run(
        ["bash", str(REPO / "bench/gpu/run.sh"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads((tmp_path / "device_check.json").read_text())}
    for name in (
        "fp.dfp_eager_vs_copy", "fp.xxh3_vs_copy", "fp.dfp_eager_vs_xxh3", "checks.step_s",
        "checks.finite_vs_step", "checks.recompute_vs_step", "checks.vote_vs_step",
        "checks.overhead_at_default_cadence", "snap.stall_vs_sync_save", "nvrx.version",
    ):  # fmt: skip
        assert name in rows, name
        assert rows[name]["value"] is not None, name
    for name in ("fp.device_equals_cpu", "snap.saves_ok", "snap.saved_equals_device"):
        assert rows[name]["ok"] is True, rows[name]
    assert rows["env"]["dry_run"] is True
    assert "dry run" in rows["nvrx"]["skipped"]
    assert "figure" in proc.stdout  # the closing table
