"""`longrun records` over a local directory store, run as the real console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from training.records import schema
from training.store.interface import put_json
from training.store.local import LocalDirStore


def _longrun(store_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["LONGRUN_STORE_DIR"] = str(store_dir)
    return subprocess.run(
        [sys.executable, "-m", "longrun.cli", "records", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_runs_list_show(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    for step in (12, 30):
        alert = schema.record(
            "alert", run="r1", step=step, check="finite", suspect_ranks=[1], suspect_nodes=["n2"], evidence={}
        )
        put_json(store, schema.store_key("r1", schema.alert_path(step, "finite", "x")), alert)

    assert _longrun(tmp_path, "runs").stdout.split() == ["r1"]
    listed = _longrun(tmp_path, "list", "--run", "r1", "--kind", "alerts").stdout.split()
    assert listed == [
        "runs/r1/alerts/00000012-finite-x.json",
        "runs/r1/alerts/00000030-finite-x.json",
    ]
    # an attachment below the records (as an incident's plots) is never taken for the newest record
    store.put_bytes(schema.store_key("r1", "alerts/zz-attachments/plot.png"), b"\x89PNG")
    newest = json.loads(_longrun(tmp_path, "show", "--run", "r1", "--kind", "alerts").stdout)
    assert newest["step"] == 30
    by_key = json.loads(_longrun(tmp_path, "show", "--key", listed[0]).stdout)
    assert by_key["step"] == 12


def test_nothing_found_and_bad_usage(tmp_path: Path) -> None:
    LocalDirStore(tmp_path)
    empty = _longrun(tmp_path, "list", "--run", "r1", "--kind", "incidents")
    assert empty.returncode == 1 and "no records under runs/r1/incidents/" in empty.stdout
    assert _longrun(tmp_path, "show", "--key", "runs/r1/alerts/none.json").returncode == 1
    assert _longrun(tmp_path, "show", "--run", "r1").returncode == 2
    bad = _longrun(tmp_path, "list", "--run", "../etc", "--kind", "alerts")
    assert bad.returncode == 2 and "run name" in bad.stderr
