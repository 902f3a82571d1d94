"""scripts/count_record_lookups.py: the rules that take a `.get("` line out of the record count."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "count_record_lookups.py"
_spec = importlib.util.spec_from_file_location("count_record_lookups", _PATH)
assert _spec and _spec.loader
counter = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = counter  # dataclasses look their module up
_spec.loader.exec_module(counter)


@pytest.mark.parametrize(
    ("path", "text", "category"),
    [
        ("plugins/longrun/x.py", 'step = alert.get("step")', "record"),
        ("plugins/longrun/x.py", 'job = os.environ.get("SLURM_JOB_ID")', "environment"),
        ("plugins/longrun/x.py", 'mode = params.get("incident_mode")', "airflow"),
        ("plugins/longrun/ui/app.py", '    @app.get("/nodes", response_class=HTMLResponse)', "route"),
        ("plugins/longrun/slurm/parse.py", 'state = d.get("JobState")', "slurm"),
        ("training/records/job.py", 'ranks = obj.get("ranks")', "typed layer"),
        ("training/store/s3.py", 'code = err.get("Code")', "boto"),
        # one record lookup on a line makes the line a record lookup
        ("plugins/longrun/x.py", 'x = os.environ.get("A") or inc.extra.get("verdict")', "record"),
        # a file's rule does not hide a record read in it elsewhere: the receiver decides
        ("plugins/longrun/ui/app.py", 'n = alert.get("step")', "record"),
    ],
)
def test_classify(path: str, text: str, category: str) -> None:
    assert counter.classify(None, path, 1, text)[0] == category


def test_receivers_skip_calls_and_parentheses() -> None:
    text = 'x = (plan.get("a") or {}).get("b"); y = self.get("/x").get("c")'
    assert counter.receivers(text) == ["plan", '(plan.get("a") or {})', "self", 'self.get("/x")']


def test_it_counts_the_same_lines_as_the_grep(monkeypatch: pytest.MonkeyPatch) -> None:
    """On disk, the script's lines are exactly those of the issue's `grep -rn '\\.get("' plugins/longrun
    training` (run from the repository root)."""
    root = _PATH.parents[1]
    monkeypatch.chdir(root)
    grep = subprocess.run(
        ["grep", "-rn", '\\.get("', *counter.PATHS], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    want = sorted(line.split(":", 2)[0] + ":" + line.split(":", 2)[1] for line in grep)
    got = sorted(f"{p}:{n}" for p, n, _t in counter.grep_lines(None))
    assert got and got == want
