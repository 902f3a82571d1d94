"""scripts/venv-python.sh: the one choice of the interpreter .venv is built from (the Makefile builds with it
and records it in the stamp; scripts/setup-system.sh checks it).

Debian's python3 comes first when it is 3.11 or 3.12, since the local stack's job user can run it; else
python3 on PATH, said on stderr; else a refusal. The system Python is this test's own interpreter, or a
small stand-in named through LONGRUN_SYSTEM_PYTHON; python3 on PATH is a stand-in that reports a path of
its own, so that which one was chosen shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "venv-python.sh"


def _choose(system_python: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LONGRUN_SYSTEM_PYTHON": system_python}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["/bin/bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)


def _base_of(python: str) -> str:
    """Where `python` resolves to, as the script reports it."""
    out = subprocess.run(
        [python, "-c", "import os, sys; print(os.path.realpath(sys.executable))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


def _unsupported_python(tmp_path: Path) -> Path:
    """A stand-in for a system python3 of an unsupported version (Debian 13's 3.13): it fails the check."""
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    return fake


def _path_with_python(tmp_path: Path) -> tuple[str, str]:
    """A PATH whose python3 is a stand-in of a supported version that reports itself as the path
    returned (so a choice of it is told apart from the system Python), and the basic tools."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    reported = str(bindir / "python3-on-path")
    fake = bindir / "python3"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *realpath*) echo {reported} ;; esac\nexit 0\n')
    fake.chmod(0o755)
    return f"{bindir}:/usr/bin:/bin", reported


def test_a_supported_system_python_is_chosen_before_python3_on_path(tmp_path) -> None:
    path, on_path = _path_with_python(tmp_path)
    out = _choose(sys.executable, path=path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == _base_of(sys.executable) != on_path
    assert out.stderr == ""


@pytest.mark.parametrize("system", ["missing", "unsupported"])
def test_without_a_supported_system_python_python3_on_path_is_chosen_and_said(tmp_path, system) -> None:
    chosen = str(tmp_path / "no-such-python") if system == "missing" else str(_unsupported_python(tmp_path))
    path, on_path = _path_with_python(tmp_path)
    out = _choose(chosen, path=path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == on_path
    assert "using python3 on PATH" in out.stderr
    assert "job user" in out.stderr


def test_without_any_supported_python_it_refuses_and_says_why(tmp_path) -> None:
    out = _choose(str(_unsupported_python(tmp_path)), path=f"{tmp_path / 'empty'}:/nonexistent")
    assert out.returncode == 1
    assert out.stdout == ""
    assert "needs Python 3.11 or 3.12" in out.stderr
