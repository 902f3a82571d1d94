"""Process records: a PID is only ours while its start time matches."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from longrun.stack import procs


def _sleeper(tmp_path: Path, name: str = "sleeper") -> procs.ProcRecord:
    return procs.spawn(
        name=name,
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
        log=tmp_path / f"{name}.log",
        env=os.environ,
    )


def test_spawn_alive_stop(tmp_path: Path) -> None:
    rec = _sleeper(tmp_path)
    assert procs.alive(rec)
    assert procs.stop([rec], timeout=5.0) == []
    assert not procs.alive(rec)


def test_other_start_time_is_not_ours(tmp_path: Path) -> None:
    rec = _sleeper(tmp_path)
    try:
        impostor = replace(rec, start_ticks=rec.start_ticks - 1)
        assert not procs.alive(impostor)
        procs.stop([impostor], timeout=1.0)  # must not signal the live process
        assert procs.alive(rec)
    finally:
        procs.stop([rec], timeout=5.0)


def test_sigterm_ignored_then_killed(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    log = tmp_path / "stubborn.log"
    rec = procs.spawn(name="stubborn", argv=[sys.executable, "-c", code], log=log, env=os.environ)
    procs.wait_for(lambda: "ready" in log.read_text(), what="stubborn", timeout=10.0)
    assert procs.stop([rec], timeout=0.5) == ["stubborn"]
    assert not procs.alive(rec)


def test_records_round_trip(tmp_path: Path) -> None:
    rec = procs.ProcRecord(name="x", pid=1234, start_ticks=5, log="/l")
    procs.save_records(tmp_path / "pids.json", [rec])
    assert procs.load_records(tmp_path / "pids.json") == [rec]
    assert procs.load_records(tmp_path / "absent.json") == []


def test_wait_for_names_dead_process_and_log(tmp_path: Path) -> None:
    rec = procs.spawn(name="quitter", argv=["true"], log=tmp_path / "q.log", env=os.environ)
    with pytest.raises(
        procs.StackError, match=r"slow thing: process quitter \(pid \d+\) exited; see .*q.log"
    ):
        procs.wait_for(lambda: False, what="slow thing", timeout=10.0, log=tmp_path / "q.log", watch=[rec])


def test_record_validation() -> None:
    with pytest.raises(ValueError, match="pid must be > 1, got 0"):
        procs.ProcRecord(name="x", pid=0, start_ticks=1, log="")
