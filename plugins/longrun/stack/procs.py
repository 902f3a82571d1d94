"""Start, recognise and stop the stack's daemons, always by recorded PID.

A PID alone can be reused by the kernel after a process dies, so each record also keeps the process's
start time (field 22 of /proc/<pid>/stat): a live process with another start time is not ours and is
never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


class StackError(RuntimeError):
    """A stack component failed to start, stop or answer; the message names it and its log file."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcRecord:
    """One daemon the stack started."""

    name: str
    """What it is, e.g. `slurmd-n3`; unique within a component."""
    pid: int
    """Its process id."""
    start_ticks: int
    """Its start time in clock ticks since boot, to tell it from a later process with the same PID."""
    log: str
    """The file its stdout and stderr go to."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError(f"name must not be empty, got {self.name!r}")
        if self.pid <= 1:
            raise ValueError(f"pid must be > 1, got {self.pid!r}")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when there is no such process."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def _reap(pid: int) -> None:
    # A child we started that has exited stays a zombie until waited for; reap it if it is ours.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def alive(rec: ProcRecord) -> bool:
    """True when the recorded process still runs (a zombie counts as dead)."""
    _reap(rec.pid)
    fields = _stat_fields(rec.pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return int(fields[19]) == rec.start_ticks


def spawn(
    *, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path | None = None
) -> ProcRecord:
    """Start a daemon in the foreground of its own session, output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
                # Own session: a Ctrl-C in the starting shell does not reach it, and its
                # children share its process group for a last-resort kill.
                start_new_session=True,
            )
        except OSError as exc:
            raise StackError(f"{name}: cannot start {argv[0]}: {exc}") from exc
    ticks = start_ticks(proc.pid)
    if ticks is None:
        raise StackError(f"{name}: exited at once; see {log}")
    # Popen's own reaping is not needed: alive() and stop() reap by PID.
    proc.returncode = 0
    return ProcRecord(name=name, pid=proc.pid, start_ticks=ticks, log=str(log))


def stop(recs: Sequence[ProcRecord], *, timeout: float, sig: int = signal.SIGTERM) -> list[str]:
    """Signal each live record, wait up to `timeout` s for all, then SIGKILL their process groups.

    Returns the names of processes that needed SIGKILL.
    """
    live = [r for r in recs if alive(r)]
    for rec in live:
        try:
            os.kill(rec.pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(r) for r in live):
        time.sleep(0.05)
    killed = []
    for rec in live:
        if alive(rec):
            killed.append(rec.name)
            # Each daemon leads its own process group (start_new_session), so this reaches its
            # workers too and nothing outside what we started.
            try:
                os.killpg(rec.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    kill_deadline = time.monotonic() + 5.0
    while time.monotonic() < kill_deadline and any(alive(r) for r in live):
        time.sleep(0.05)
    return killed


def leftovers(rec: ProcRecord) -> list[int]:
    """PIDs still running in the session of a recorded daemon that has died: what it forked and left
    behind (e.g. a killed Airflow scheduler's LocalExecutor workers, which keep its database
    connections and their open transactions). Empty while the daemon itself runs.

    Only processes in the session the recorded PID leads (spawn starts each daemon in a new session)
    and started after it count. Linux does not hand out a PID while it still names a live session, so
    when another process now holds the PID our session is wholly gone and nothing is returned.
    """
    _reap(rec.pid)
    me = _stat_fields(rec.pid)
    if me is not None and not (me[0] in ("Z", "X") and int(me[19]) == rec.start_ticks):
        return []  # alive, or the number now names another process
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or fields[0] in ("Z", "X"):
            continue
        if int(fields[3]) == rec.pid and int(fields[19]) >= rec.start_ticks:
            found.append(int(entry.name))
    return sorted(found)


def end_leftovers(rec: ProcRecord, *, rounds: int = 5) -> list[int]:
    """SIGKILL what a dead daemon left running in its session (see `leftovers`), as a service
    manager ends a unit's whole control group when its main process dies; returns the PIDs ended.
    A few rounds, since a leftover may fork while we look."""
    ended: list[int] = []
    for _ in range(rounds):
        pids = leftovers(rec)
        if not pids:
            break
        kill_pids(pids)
        ended.extend(pids)
    return ended


def wait_for(
    check: Callable[[], bool],
    *,
    what: str,
    timeout: float,
    log: str | Path | None = None,
    watch: Sequence[ProcRecord] = (),
    interval: float = 0.1,
) -> float:
    """Poll `check` until it is true; returns the seconds it took.

    Fails early when a watched process dies, and names `what` and the log file in the error.
    """
    t0 = time.monotonic()
    where = f"; see {log}" if log else ""
    while True:
        try:
            if check():
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - any failure of a probe means "not ready yet"
            pass
        for rec in watch:
            if not alive(rec):
                raise StackError(f"{what}: process {rec.name} (pid {rec.pid}) exited{where}")
        if time.monotonic() - t0 > timeout:
            raise StackError(f"{what}: not ready after {timeout:.0f} s{where}")
        time.sleep(interval)


def save_records(path: Path, recs: Sequence[ProcRecord]) -> None:
    """Write the records atomically (a crash mid-write must not lose the PIDs of live daemons)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(r) for r in recs], indent=1) + "\n")
    os.replace(tmp, path)


def load_records(path: Path) -> list[ProcRecord]:
    """The records in `path`; none when it does not exist."""
    if not path.exists():
        return []
    return [ProcRecord(**item) for item in json.loads(path.read_text())]


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (keys, passwords), 0600 from its first byte.

    The text goes to a new file next to `path`, created with mode 0600 (`tempfile.mkstemp`: O_CREAT |
    O_EXCL, never through a link), then renamed over `path`. An existing file is replaced, never written
    into: one that had a wider mode (a reader may hold it open) or was a planted link never gets the secret.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # exactly 0600, whatever the umask
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))):
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def job_step_tree(slurm_conf: str) -> list[int]:
    """PIDs of every slurmstepd started for the cluster whose config is `slurm_conf`, and all their
    descendants (the job scripts, srun, launchers, trainers). Found by the SLURM_CONF the daemons
    inherited from our slurmd, so another cluster's steps are never touched."""
    roots = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(b"slurmstepd") and _environ(pid).get("SLURM_CONF") == slurm_conf:
            roots.append(pid)
    tree, out = _children(), []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def _running(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has ended; only its parent can reap it


def kill_pids(pids: Sequence[int], *, timeout: float = 5.0) -> None:
    """SIGKILL each PID and wait (bounded) until they are gone."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in pids:
            _reap(pid)
        if not any(_running(pid) for pid in pids):
            return
        time.sleep(0.05)
