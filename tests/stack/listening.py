"""Who listens on which TCP address, from `ss -ltnp` (the test's view of "nothing else is exposed")."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

_PID_RE = re.compile(r"pid=(\d+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Listener:
    """One listening TCP socket."""

    address: str
    """Local address, e.g. 127.0.0.1 or 0.0.0.0 or [::]."""
    port: int
    """Local port."""
    pids: tuple[int, ...]
    """Processes holding it."""


def listeners() -> list[Listener]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10, check=True).stdout
    found = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 4:
            continue
        address, _, port = cols[3].rpartition(":")
        found.append(
            Listener(address=address, port=int(port), pids=tuple(int(p) for p in _PID_RE.findall(line)))
        )
    return found


def process_group_pids(pgids: set[int]) -> set[int]:
    """Every live PID in the given process groups (a daemon and the workers it forked); zombies,
    which hold nothing and wait for init to reap them, do not count."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True, timeout=10, check=True
    )
    pids = set()
    for line in out.stdout.splitlines():
        pid, pgid, stat = line.split()
        if int(pgid) in pgids and not stat.startswith("Z"):
            pids.add(int(pid))
    return pids
