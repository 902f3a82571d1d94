"""`longrun entrypoint check` (training.conformance): an entrypoint on 3 local CPU ranks, clean, resumed from
its own checkpoint and with a drill, reported record by record. Real processes: the command under test starts
the ranks itself (gloo, nodes n1..n3)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from longrun.cli import main as longrun_main

from training.conformance import NO_RECORDS

RUNS = ("A clean", "B resume", "C drill")


def check(*args: str, timeout: float = 600) -> tuple[int, str, str]:
    p = subprocess.run(
        [sys.executable, "-m", "training.conformance", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return p.returncode, p.stdout, p.stderr


def rows(stdout: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(run, expectation) -> (result, detail) of the table's rows (continuation lines left out)."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith(RUNS):
            run, what, status, *detail = re.split(r"\s{2,}", line, maxsplit=3)
            out[(run, what)] = (status, detail[0] if detail else "")
    return out


def test_the_reference_trainer_conforms() -> None:
    rc, out, err = check("--steps", "8", "--", sys.executable, "-m", "training.train")
    table = rows(out)
    assert rc == 0, out + err
    assert {run for run, _ in table} == set(RUNS), out
    assert all(status == "ok" for status, _ in table.values()), out
    assert table[("B resume", "final_fingerprint equals run A's")][1].endswith("(bit-identical)")
    assert table[("C drill", "one alert: weight_vote, rank 1 / node n2")] == ("ok", "step 8")
    assert out.splitlines()[-1].startswith("PASS: all ")


def test_an_entrypoint_that_writes_no_record_fails_clearly(tmp_path: Path) -> None:
    script = tmp_path / "idle.py"
    script.write_text("import time\ntime.sleep(1)\n")
    rc, out, err = check("--timeout-s", "60", "--", sys.executable, str(script))
    assert rc == 1, out + err
    table = rows(out)
    assert table[("A clean", "exit 0 on every rank")][0] == "ok"
    assert table[("A clean", "longrun records")] == ("MISSING", NO_RECORDS)
    assert table[("B resume", "run")][0] == "MISSING" and table[("C drill", "run")][0] == "MISSING"
    assert out.splitlines()[-1].startswith("FAIL: ")


def test_an_entrypoint_that_fails_shows_its_stderr(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text(
        "import sys\nprint('Traceback: the loss is not defined', file=sys.stderr)\nsys.exit(3)\n"
    )
    rc, out, err = check("--timeout-s", "60", "--", sys.executable, str(script))
    assert rc == 1, out + err
    status, detail = rows(out)[("A clean", "exit 0 on every rank")]
    assert status == "WRONG" and detail.startswith("exit codes r0=3, r1=3, r2=3"), out
    assert "Traceback: the loss is not defined" in out


def test_an_entrypoint_that_ignores_the_resume_point_fails_the_resume_row(tmp_path: Path) -> None:
    script = tmp_path / "no_resume.py"
    script.write_text(
        "import os, runpy, sys\n"
        "os.environ.pop('LONGRUN_RESUME_FROM', None)  # the bug: the relaunch's resume point is dropped\n"
        "sys.argv = [sys.argv[0]]\n"
        "runpy.run_module('training.train', run_name='__main__', alter_sys=True)\n"
    )
    rc, out, err = check("--steps", "8", "--", sys.executable, str(script))
    assert rc == 1, out + err
    table = rows(out)
    assert all(status == "ok" for (run, _), (status, _) in table.items() if run != "B resume"), out
    status, detail = table[("B resume", "resumed at step 4 (segment start_step)")]
    assert status == "WRONG" and "started at step 0: LONGRUN_RESUME_FROM was not used" in detail, out
    assert out.splitlines()[-1] == f"FAIL: 1 of {len(table)} expectations do not hold"


def test_bad_options_are_refused_before_anything_runs(capsys) -> None:
    assert longrun_main(["entrypoint", "check", "--steps", "12", "--drill", "scale:9:1", "--", "x"]) == 2
    assert "only a recompute step" in capsys.readouterr().err
    assert longrun_main(["entrypoint", "check", "--drill", "crash:4:1", "--", "x"]) == 2
    assert longrun_main(["entrypoint", "check", "--checkpoint-every", "7", "--", "x"]) == 2
    assert longrun_main(["entrypoint", "check", "python", "-m", "x"]) == 2  # no `--`
    assert "after `--`" in capsys.readouterr().err
