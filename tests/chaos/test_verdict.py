"""The verdict rule of the fault matrix (tests/chaos/verdict.py), on stand-in cells in a pytest session of
their own (a subprocess: a real SIGINT and SIGTERM reach it, not this session). No stack, seconds.

A cell passes only through its CELL line; one that returns without it fails; one interrupted by SIGINT
or SIGTERM in its body fails and stops the session; one interrupted in its setup is listed as having no
result. Before this rule, an interrupted cell could be reported PASSED without its CELL line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

CONFTEST = """
from chaos.verdict import cell_done, register

def pytest_configure(config):
    register(config)
"""

CELLS = """
import os, signal, time
import pytest

@pytest.fixture
def interrupted_setup():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)

def test_complete(cell_done):
    cell_done("CELL complete: checks held")

def test_not_a_cell():
    pass

def test_incomplete(cell_done):
    return  # a body that ends early, whatever the cause, never checked the end state

def test_cleanup_then_interrupt(cell_done):
    try:
        os.kill(os.getpid(), signal.{sig})
        time.sleep(30)
        cell_done("CELL unreachable")
    except BaseException:
        print("clean-up ran")
        raise

def test_after_interrupt(cell_done):
    cell_done("CELL after: must not run")
"""


def _session(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # none of the repository's options
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cells.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}  # tests/: `chaos.verdict`
    # A session started in the background (nohup, `cmd &` in a script, some CI runners) inherits SIGINT
    # ignored, and Python then keeps ignoring it: give the child Python's own Ctrl-C handler back.
    launcher = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
        " sys.argv[0] = 'pytest'; runpy.run_module('pytest', run_name='__main__')"
    )
    cmd = [sys.executable, "-c", launcher, "-p", "no:cacheprovider", "-s", "-rA", "-c", "pytest.ini", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _summary(out: str) -> list[str]:
    """The lines of the "chaos cells" section."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("=") and "chaos cells" in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("=")), len(lines))
    return [line for line in lines[start + 1 : end] if " test_cells.py::" in line]


def _verdicts(tmp_path: Path, sig: str) -> None:
    p = _session(tmp_path, CELLS.replace("{sig}", sig))
    out = p.stdout + p.stderr
    assert p.returncode == 2, out  # interrupted: pytest's exit status 2, not 0 (all passed) nor 1
    assert "PASSED test_cells.py::test_complete" in out, out
    assert "PASSED test_cells.py::test_not_a_cell" in out, out
    assert "FAILED test_cells.py::test_incomplete" in out, out
    assert "returned without its CELL line" in out, out
    assert "clean-up ran" in out, out  # the test's own clean-up ran before the verdict
    assert "FAILED test_cells.py::test_cleanup_then_interrupt" in out, out
    assert "interrupted" in out and "no result" in out, out
    assert "CELL after" not in out, out  # the session stopped at the interrupted cell
    summary = _summary(out)
    assert [s.split()[:2] for s in summary] == [
        ["PASSED", "test_cells.py::test_complete"],
        ["FAILED", "test_cells.py::test_incomplete"],
        ["FAILED", "test_cells.py::test_cleanup_then_interrupt"],
    ], summary
    assert summary[0].endswith("CELL complete: checks held"), summary


def test_sigint_in_a_cell_fails_it_and_stops(tmp_path: Path) -> None:
    _verdicts(tmp_path, "SIGINT")


def test_sigterm_in_a_cell_fails_it_and_stops(tmp_path: Path) -> None:
    _verdicts(tmp_path, "SIGTERM")


def test_interrupt_in_setup_is_listed_without_result(tmp_path: Path) -> None:
    body = (
        CELLS.replace("{sig}", "SIGINT") + "\n\ndef test_setup_cut(interrupted_setup, cell_done):\n    pass\n"
    )
    p = _session(tmp_path, body, "-k", "setup_cut")
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "PASSED" not in out, out
    assert [s.split()[:4] for s in _summary(out)] == [
        ["NO", "RESULT", "(INTERRUPTED)", "test_cells.py::test_setup_cut"]
    ], out


SWALLOWED = """
import gc, os, signal, time, weakref

class Thing:
    pass

def test_swallowed(cell_done):
    # The SIGTERM reaches the handler inside a weakref callback, where its KeyboardInterrupt cannot be
    # raised (Python reports it as unraisable), as it did once in SQLAlchemy's GC callback.
    def callback(ref):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    thing = Thing()
    ref = weakref.ref(thing, callback)
    del thing
    gc.collect()
    cell_done("CELL swallowed: its SIGTERM was lost")

def test_after_swallowed(cell_done):
    cell_done("CELL after swallowed: must not run")
"""


def test_sigterm_lost_in_a_callback_still_stops_the_session(tmp_path: Path) -> None:
    p = _session(tmp_path, SWALLOWED)
    out = p.stdout + p.stderr
    assert "CELL swallowed: its SIGTERM was lost" in out, out  # the signal really did not interrupt
    assert "CELL after swallowed" not in out, out  # fails without verdict._RECEIVED
    assert "signal 15 received during test_cells.py::test_swallowed" in out, out
