"""Start a benchmark's workers as gloo ranks on this host, one process each, and wait for them: shared by
bench_guard.py and bench_sharded.py (not a benchmark itself: run_all.py runs only `bench_*.py`).

    rcs = run_ranks([sys.executable, __file__, "--worker", ...], ranks=6, verbose=args.verbose)

Each process gets the environment a launcher sets (RANK, WORLD_SIZE, LOCAL_RANK=0, MASTER_ADDR/PORT), one
OpenMP thread, and one node name per rank (LONGRUN_NODE_NAMES), without the caller's AWS_* and LONGRUN_FAULT*
variables (no store, no drills). Only rank 0's stderr is shown, and only when `verbose`. When one rank fails
the others are killed at once (they would otherwise wait in a collective until its timeout), and so are any
left when the wait ends (an error, the timeout, SIGTERM).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    argv: Sequence[str], ranks: int, *, verbose: bool = False, timeout_s: float = 3600
) -> list[int]:
    """Run `argv` as `ranks` gloo ranks (cwd: the repository); every rank's exit code, in rank order (-9 for
    one killed because another failed or the time ran out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LONGRUN_FAULT"))}
    env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(ranks),
               LONGRUN_NODE_NAMES=",".join(f"n{i + 1}" for i in range(ranks)))  # fmt: skip
    # SIGTERM (a timeout) must still reach the finally below, which kills the workers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    procs = [
        subprocess.Popen(
            list(argv),
            cwd=REPO,
            env=dict(env, RANK=str(r), LOCAL_RANK="0"),
            stderr=None if r == 0 and verbose else subprocess.DEVNULL,
        )
        for r in range(ranks)
    ]
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            rcs = [proc.poll() for proc in procs]
            if all(rc is not None for rc in rcs) or any(rc for rc in rcs):
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    return [proc.returncode for proc in procs]
