"""Launch the reference trainer (or another entrypoint module) as real processes: W ranks on this host,
gloo, one process per rank.

Each rank gets the variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), so
every rank's own exit code is visible. Node names come from LONGRUN_NODE_NAMES. Every process started
here is killed (by PID) when the test ends, also on failure or timeout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(tmp: Path, nodes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LONGRUN_", "SLURM"))}
    env.update(
        LONGRUN_NODE_NAMES=nodes,
        LONGRUN_STORE_DIR=str(tmp / "store"),
        LONGRUN_FAULT_STATE_DIR=str(tmp / "fault-state"),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


@dataclass
class Run:
    """The outcome of one launch."""

    rcs: list[int]
    run_dir: Path
    store_dir: Path
    logs: list[str]

    def alerts(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.run_dir / "alerts").glob("*.json"))]

    def store_alerts(self, run: str) -> list[dict[str, Any]]:
        d = self.store_dir / "runs" / run / "alerts"
        return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]

    def checks(self) -> list[dict[str, Any]]:
        live = self.run_dir / "checks-live" / "r000.jsonl"
        return [json.loads(line) for line in live.read_text().splitlines()] if live.exists() else []

    def report(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "report.json").read_text())

    def log(self) -> str:
        return "\n".join(f"--- rank {i} ---\n{text[-3000:]}" for i, text in enumerate(self.logs))


class Launcher:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def __call__(
        self,
        args: list[str],
        *,
        name: str = "run",
        nodes: str = "n1,n2,n3,n4",
        env: dict[str, str] | None = None,
        timeout_s: float = 300.0,
        module: str = "training.train",
    ) -> Run:
        """`module` other than the reference trainer gets the run dir as LONGRUN_RUN_DIR, not `--run-dir`."""
        world = len(nodes.split(","))
        run_dir = self.tmp / name
        full_env = base_env(self.tmp, nodes)
        if module != "training.train":
            full_env["LONGRUN_RUN_DIR"] = str(run_dir)
        full_env.update(env or {})
        argv = ["--run-dir", str(run_dir), *args] if module == "training.train" else list(args)
        port = free_port()
        logs = []
        procs = []
        for rank in range(world):
            e = dict(full_env, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
            log = self.tmp / f"{name}.r{rank}.log"
            logs.append(log)
            with open(log, "wb") as out:
                p = subprocess.Popen(
                    [sys.executable, "-m", module, *argv],
                    cwd=REPO, env=e, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            procs.append(p)
            self.procs.append(p)
        deadline = time.monotonic() + timeout_s
        rcs = []
        for p in procs:
            try:
                rcs.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                text = "\n".join(f"rank {i}: {log.read_text()[-2000:]}" for i, log in enumerate(logs))
                pytest.fail(f"trainer did not finish within {timeout_s}s\n{text}")
        return Run(
            rcs=rcs, run_dir=run_dir, store_dir=self.tmp / "store", logs=[lg.read_text() for lg in logs]
        )

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    launcher = Launcher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.kill()
