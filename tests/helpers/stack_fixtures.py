"""What the session fixtures in tests/conftest.py hand to tests, and how they pick their ports.

A test session runs its own stack in a temporary state dir, on a port range of its own: several
sessions (and a developer's `longrun stack up` on the default range) can run side by side. A range is
claimed with an flock on a file in the temp dir, held until the session's process ends, so a crashed
session frees its range by itself.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from longrun.stack.layout import NODES, PARTITION, SLOT_WIDTH, Layout, ports_in_use
from longrun.stack.procs import StackError
from longrun.stack.stack import Stack

TEST_PORT_BASES = tuple(22000 + SLOT_WIDTH * i for i in range(5))
"""Port bases for test sessions (the default stack uses 21800); all keep SeaweedFS's gRPC ports < 32768."""


def claim_port_base(state_dir: Path) -> tuple[int, IO[str]]:
    """A port base no other test session holds and nothing listens on, and the open lock file that
    holds it (keep it open for the session). The lock file names the holder's state dir: a later
    session that finds the range still busy although its holder is gone (a killed pytest) stops that
    stack by its recorded PIDs before taking the range."""
    if env := os.environ.get("LONGRUN_TEST_PORT_BASE"):
        # the session's stack takes the given base; a test that starts a stack of its own beside it
        # (tests/stack) takes one of the next two slots
        candidates: tuple[int, ...] = tuple(int(env) + SLOT_WIDTH * i for i in range(3))
    else:
        candidates = TEST_PORT_BASES
    for base in candidates:
        lock = open(Path(tempfile.gettempdir()) / f"longrun-test-ports-{base}.lock", "a+")  # noqa: SIM115
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        ports = Layout(state_dir=state_dir, port_base=base).all_ports()
        lock.seek(0)
        previous = lock.read().strip()
        if ports_in_use(ports) and previous and (Path(previous) / "stack.json").exists():
            try:
                Stack(Path(previous)).down(say=lambda _line: None)
            except StackError:
                pass
        # Also skip a range someone uses without the lock (e.g. a stack started by hand there).
        if ports_in_use(ports):
            lock.close()
            continue
        lock.seek(0)
        lock.truncate()
        lock.write(f"{state_dir}\n")
        lock.flush()
        return base, lock
    raise RuntimeError(f"every test port range {candidates} is held by another test session or in use")


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmCluster:
    """The four-node Slurm cluster of the test session."""

    stack: Stack
    """The stack it belongs to."""
    env: dict[str, str]
    """What a client needs on top of os.environ (SLURM_CONF)."""
    nodes: list[str] = field(default_factory=lambda: list(NODES))
    """Node names, n1..n4."""
    partition: str = PARTITION
    """The one partition, holding every node (the default)."""
    jobcomp_path: Path = Path()
    """jobcomp/filetxt's file: one line per finished job, kept after slurmctld forgets the job."""

    def __post_init__(self) -> None:
        if "SLURM_CONF" not in self.env:
            raise ValueError(f"env must hold SLURM_CONF, got keys {sorted(self.env)!r}")

    def client_env(self) -> dict[str, str]:
        """os.environ plus this cluster's variables, for subprocess calls."""
        return {**os.environ, **self.env}

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL node's slurmd by its recorded PID (the node goes `down*` after ~10-30 s)."""
        self.stack.kill_slurmd(node)

    def restart_slurmd(self, node: str) -> None:
        """Start node's slurmd again and wait until the node responds."""
        self.stack.restart_slurmd(node)


@dataclass(frozen=True, slots=True, kw_only=True)
class AirflowStack:
    """Airflow of the test session (scheduler, triggerer, dag-processor, API)."""

    url: str
    """API base URL, e.g. http://127.0.0.1:22080."""
    user: str
    """Admin user name."""
    password: str
    """Admin password."""
    env: dict[str, str]
    """Every stack variable (Slurm, S3, Airflow, AIRFLOW_HOME)."""

    def __post_init__(self) -> None:
        if not self.url.startswith("http://127.0.0.1:"):
            raise ValueError(f"url must be on 127.0.0.1, got {self.url!r}")
