"""Process records: a PID is only ours while its start time matches."""

from __future__ import annotations

import os
import signal
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
    # SIGTERM alone ends it (nothing needed SIGKILL); stop() returns once it is gone, so the bound is only
    # what a loaded host might take to let it die, never a wait.
    assert procs.stop([rec], timeout=60.0) == []
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


# A daemon that forks a worker and records its PID, as Airflow's scheduler forks LocalExecutor workers.
_FORKER = """
import os, sys, time
pid = os.fork()
if pid == 0:
    time.sleep(120)
    os._exit(0)
open(sys.argv[1], "w").write(str(pid))
time.sleep(120)
"""
# A parent that starts the daemon in its own session and never reaps it: once killed, the daemon stays
# a zombie (as under an init that reaps late) and its session still names its PID.
_NEGLECTFUL_PARENT = """
import subprocess, sys, time
p = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
open(sys.argv[3], "w").write(str(p.pid))
time.sleep(120)
"""


def test_dead_daemons_leftovers_are_ended_and_nothing_else(tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    rec = procs.spawn(
        name="forker",
        argv=[sys.executable, "-c", _FORKER, str(child_file)],
        log=tmp_path / "f.log",
        env=os.environ,
    )
    bystander = _sleeper(tmp_path, "bystander")  # another session the stack started: not the dead one's
    try:
        procs.wait_for(lambda: child_file.exists() and child_file.read_text() != "", what="fork", timeout=30)
        child = int(child_file.read_text())
        assert procs.leftovers(rec) == [], "a live daemon has no leftovers"
        os.kill(rec.pid, signal.SIGKILL)
        procs.wait_for(lambda: not procs.alive(rec), what="daemon death", timeout=10)
        # The attack's precondition: the worker outlives its daemon.
        assert procs.leftovers(rec) == [child]
        assert procs.end_leftovers(rec) == [child]
        assert procs.leftovers(rec) == []
        assert procs.start_ticks(child) is None or Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
        assert procs.alive(bystander)
    finally:
        procs.stop([rec, bystander], timeout=5)
        if child_file.exists() and child_file.read_text():
            procs.kill_pids([int(child_file.read_text())])


def test_leftovers_of_a_daemon_that_is_still_a_zombie(tmp_path: Path) -> None:
    child_file, leader_file = tmp_path / "child.pid", tmp_path / "leader.pid"
    parent = procs.spawn(
        name="parent",
        argv=[sys.executable, "-c", _NEGLECTFUL_PARENT, _FORKER, str(child_file), str(leader_file)],
        log=tmp_path / "p.log",
        env=os.environ,
    )
    try:
        procs.wait_for(lambda: child_file.read_text() != "", what="fork", timeout=30)
        leader = int(leader_file.read_text())
        ticks = procs.start_ticks(leader)
        assert ticks is not None
        rec = procs.ProcRecord(name="daemon", pid=leader, start_ticks=ticks, log=str(tmp_path / "d.log"))
        os.kill(leader, signal.SIGKILL)
        procs.wait_for(lambda: not procs.alive(rec), what="daemon death", timeout=10)
        assert Path(f"/proc/{leader}/stat").read_text().split()[2] == "Z"
        assert procs.end_leftovers(rec) == [int(child_file.read_text())]
        assert procs.leftovers(rec) == []
    finally:
        procs.stop([parent], timeout=5)
        if child_file.exists() and child_file.read_text():
            procs.kill_pids([int(child_file.read_text())])
