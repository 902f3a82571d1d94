"""`longrun audit run|fetch` from a shell, over a local store (the installed console script)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from training.records import schema
from training.store.local import LocalDirStore

from .builders import healthy_run

LONGRUN = str(Path(sys.executable).parent / "longrun")


def _longrun(store_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ENDPOINT_URL", "LONGRUN_S3")}
    env["LONGRUN_STORE_DIR"] = str(store_dir)
    return subprocess.run([LONGRUN, "audit", *args], capture_output=True, text=True, timeout=300, env=env)


def test_run_fetch_and_fail(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = LocalDirStore(store_dir)
    healthy_run(store, "alpha")

    ok = _longrun(store_dir, "run", "--id", "by-hand", "--sample-size", "100")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "passed" in ok.stdout and "audit/by-hand/docs/index.html" in ok.stdout

    got = _longrun(store_dir, "fetch", "--id", "by-hand", "--dest", str(tmp_path / "report"))
    assert got.returncode == 0, got.stderr[-3000:]
    assert (tmp_path / "report" / "docs" / "index.html").is_file()
    assert (tmp_path / "report" / "summary.json").is_file()

    store.put_bytes(schema.store_key("alpha", schema.manifest_path(40)), b"not json")
    bad = _longrun(store_dir, "run", "--id", "broken")
    assert bad.returncode == 1
    assert "parsable" in bad.stderr and "runbooks/audit-failed.md" in bad.stderr

    missing = _longrun(store_dir, "fetch", "--id", "nope", "--dest", str(tmp_path / "x"))
    assert missing.returncode == 2 and "no report under audit/nope/" in missing.stderr
