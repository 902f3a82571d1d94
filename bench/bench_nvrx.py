"""Recovery overhead of an in-job restart: from a worker's death (SIGKILL) to the job training again.

Runs the reference trainer under NVRx's ft_launcher, one agent per "node" (3 nodes x 1 CPU rank by
default), kills rank 1 at a step with the `crash` drill, and reads the timeline back from the logs:

    detection    the rank dies -> its agent sees the exit                      (agent monitor interval)
    shutdown     -> every agent has stopped its other workers                  (workers_stop_timeout)
    rendezvous   -> every agent has joined the next rendezvous round
    start        -> every new worker has imported torch, joined the process group, met the rank monitor
    ckpt_load    -> the newest checkpoint of this launch is loaded
    first_step   -> the first step after the restart is done (its heartbeat is sent)

Two ways to launch: `--mode local` (default) starts the agents here on 127.0.0.1, as srun would;
`--mode slurm` submits `longrun.launch.job_spec_for_run` to the cluster $SLURM_CONF names.

    python bench/bench_nvrx.py --repeat 2
    python bench/bench_nvrx.py --mode slurm

The crash comes late (step 95 of 100) so that a checkpoint is complete by then: the first save starts
NVRx's async upload worker, ~10 s on a loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# ---- the timeline, from log text -------------------------------------------------------------------

_TS = re.compile(r"^\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]?")
PHASES = ("detection", "shutdown", "rendezvous", "start", "ckpt_load", "first_step")


def _ts(line: str) -> float | None:
    m = _TS.match(line)
    if not m:
        return None
    return dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _times(lines: list[str], pattern: str, after: float = float("-inf")) -> list[float]:
    rx = re.compile(pattern)
    return [t for line in lines if rx.search(line) and (t := _ts(line)) is not None and t >= after]


def timeline(log: str) -> dict[str, float]:
    """Seconds per phase (see the module docstring), plus `total`, `crash_step` and `resumed_step`."""
    lines = log.splitlines()
    death = _times(lines, r"FAULT crash: rank \d+ SIGKILLs itself")
    if not death:
        raise ValueError("no crash in the log: was the crash drill injected?")
    t0 = death[0]
    marks = {
        "detection": min(_times(lines, r"failed \(exitcode: -9\)", t0)),
        "shutdown": max(_times(lines, r"attempts to join the next round", t0)),
        "rendezvous": max(_times(lines, r"has joined round [1-9]\d* of the rendezvous", t0)),
        "start": max(_times(lines, r"NVRx \S+ heartbeats on \(restart [1-9]", t0)),
        # No "resumed from" line: no complete checkpoint yet, the restart started from scratch.
        "ckpt_load": max(_times(lines, r"resumed from .* at step \d+", t0), default=None),
        "first_step": max(_times(lines, r"NVRx first heartbeat of restart [1-9]", t0)),
    }
    out, prev = {}, t0
    for phase in PHASES:
        mark = marks[phase] if marks[phase] is not None else prev
        out[phase] = round(mark - prev, 3)
        prev = mark
    out["total"] = round(prev - t0, 3)
    crash = re.search(r"SIGKILLs itself at step (\d+)", log)
    resumed = re.search(r"resumed from .* at step (\d+)", log)
    out["crash_step"] = float(crash.group(1)) if crash else -1
    out["resumed_step"] = float(resumed.group(1)) if resumed else -1
    return out


def overhead_line(t: dict[str, float]) -> str:
    """One line in the spirit of the AWS NVRx sample's recovery-overhead summary."""
    parts = ", ".join(f"{p} {t[p]:.2f}s" for p in PHASES)
    lost = int(t["crash_step"] - t["resumed_step"]) if t["resumed_step"] >= 0 else -1
    return f"recovery overhead {t['total']:.2f}s = {parts}; steps replayed: {lost}"


# ---- launching -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_args(a: argparse.Namespace, run_dir: Path) -> list[str]:
    return [
        "--run-dir", str(run_dir), "--model", a.model, "--steps", str(a.steps),
        "--checkpoint-every", str(a.checkpoint_every), "--recompute-every", "5", "--vote-every", "5",
        "--fault", f"crash:{a.crash_step}:1", "--no-store",
    ]  # fmt: skip


def run_local(a: argparse.Namespace, work: Path) -> str:
    """One ft_launcher per node on 127.0.0.1 (what the job script's srun line starts on each node)."""
    run_dir = work / "run"
    port = _free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "LONGRUN_LAUNCH_T0": str(int(time.time())),
        "LONGRUN_NODE_NAMES": ",".join(f"n{i + 1}" for i in range(a.nodes)),
        "LONGRUN_NVRX_INITIAL_TIMEOUT_S": "120",
        "LONGRUN_NVRX_TIMEOUT_S": "60",
        "LONGRUN_NVRX_MIN_TIMEOUT_S": "10",
    }
    launcher = str(Path(sys.executable).with_name("ft_launcher"))
    procs, logs = [], []
    for node in range(a.nodes):
        log = open(work / f"agent-{node}.log", "w")  # noqa: SIM115 (closed below)
        logs.append(log)
        argv = [
            launcher, f"--nnodes={a.nodes}", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bench{port}", "--max-restarts=2",
            "--monitor-interval=0.5", "--workers-stop-timeout=15", "--ft-initial-rank-heartbeat-timeout=120",
            "--ft-rank-heartbeat-timeout=60", "--ft-workload-check-interval=1", "--ft-enable-nic-monitor=false",
            "--module", "training.train", *train_args(a, run_dir),
        ]  # fmt: skip
        node_env = {**env, "PET_RDZV_CONF": f"is_host={int(node == 0)}"}
        procs.append(subprocess.Popen(argv, env=node_env, stdout=log, stderr=subprocess.STDOUT, cwd=work))
    try:
        for p in procs:
            p.wait(timeout=a.timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        for log in logs:
            log.close()
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"agents exited {[p.returncode for p in procs]}; logs in {work}")
    return "\n".join((work / f"agent-{n}.log").read_text() for n in range(a.nodes))


def run_slurm(a: argparse.Namespace, work: Path) -> str:
    """Through the launch path itself: job_spec_for_run -> sbatch on the cluster $SLURM_CONF names."""
    import dataclasses

    from longrun.launch import job_spec_for_run
    from longrun.nvrx_launch import NvrxLaunch
    from longrun.runspec import Drill, RunSpec
    from longrun.slurm import ops
    from longrun.slurm.cli_backend import CliSlurmClient
    from longrun.slurm.models import ACTIVE
    from longrun.slurm.spec import JobTag

    run = RunSpec(
        run_name=f"bench-nvrx-{int(time.time())}",
        nodes=a.nodes,
        gpus_per_node=0,
        model=a.model,
        steps=a.steps,
        checkpoint_every=a.checkpoint_every,
        drill=Drill(kind="crash", step=a.crash_step, target="1"),
        max_restarts=2,
        time_limit_min=15,
    )
    nvrx = NvrxLaunch.for_step_time(0.5)
    if a.port_base is not None:
        nvrx = dataclasses.replace(nvrx, port_base=a.port_base)
    env = {
        "SLURM_CONF": os.environ["SLURM_CONF"],
        "OMP_NUM_THREADS": "1",
        "LONGRUN_STORE_DIR": str(work / "store"),
    }
    tag = JobTag(dag_id="bench", run_id=run.run_name, task_id="nvrx")
    spec = job_spec_for_run(run, tag=tag, run_dir_root=str(work), env=env, nvrx=nvrx, python=sys.executable)
    client = CliSlurmClient()
    job = client.submit(spec)
    try:
        state = ops.wait_for(client, job, lambda s: s.status not in ACTIVE, timeout_s=a.timeout, poll_s=1.0)
    finally:
        if client.job(job).is_active:
            client.cancel(job)
    out = work / f"{run.run_name}.slurm-{job}.out"
    log = out.read_text() if out.exists() else ""
    if state.exit_code != 0:
        tail = "\n".join(ln[:200] for ln in log.splitlines() if "pynvml" not in ln)[-6000:]
        raise RuntimeError(f"job {job} ended {state.describe()}; its log ends:\n{tail}")
    return log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("local", "slurm"), default="local")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--crash-step", type=int, default=95)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", action="store_true", help="print each timeline as JSON too")
    p.add_argument("--log-dir", help="keep each run's combined log here")
    p.add_argument(
        "--port-base", type=int, help="slurm mode: rendezvous port base (default: training.ports, 23500)"
    )
    a = p.parse_args(argv)
    print("command: python bench/bench_nvrx.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:])))
    print(f"nodes {a.nodes} x 1 CPU rank, model {a.model}, steps {a.steps}, checkpoint every "
          f"{a.checkpoint_every}, SIGKILL rank 1 at step {a.crash_step}, {os.cpu_count()} cores, mode {a.mode}")  # fmt: skip
    results = []
    for i in range(a.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-nvrx-") as tmp:
            log = (run_local if a.mode == "local" else run_slurm)(a, Path(tmp))
            if a.log_dir:
                Path(a.log_dir).mkdir(parents=True, exist_ok=True)
                (Path(a.log_dir) / f"bench-nvrx-{i + 1}.log").write_text(log)
            try:
                t = timeline(log)
            except ValueError:
                # e.g. a hang detected before the crash step (then the crash drill is not re-injected)
                for line in log.splitlines():
                    if re.search(r"Did not get|FT timeout|in-job restart \d+:|exitcode", line):
                        print(line[:200], file=sys.stderr)
                raise
        results.append(t)
        print(f"[{i + 1}/{a.repeat}] {overhead_line(t)}")
        if a.json:
            print(json.dumps(t))
    if a.repeat > 1:
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        print(f"median: {overhead_line(med)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
