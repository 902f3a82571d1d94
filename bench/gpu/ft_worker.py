"""A worker for bench/gpu/nvrx_check.py, started by NVRx's ft_launcher (two per GPU).

It trains nothing real: a CUDA matmul per step (CPU without a GPU), a gloo all-reduce of a CPU tensor
(NCCL refuses two ranks on one GPU), and the heartbeat through longrun's own NVRx adapter
(training.nvrx.NvrxMonitor). Drills by incarnation (the adapter's job-wide restart count):

    crash    incarnation 0, rank 1 SIGKILLs itself at --fault-step
    hang     incarnation 1, rank 0 stops sending heartbeats (sleeps) at --fault-step
    verdict  incarnation 0, rank 0 asks NVRx not to restart and exits 93 at --fault-step

Each rank appends one JSON line per event to <dir>/events.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from training.nvrx.adapter import NvrxMonitor
from training.records.schema import EXIT_SDC_VERDICT


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--drills", default="crash,hang", help="comma list of crash, hang, verdict")
    p.add_argument("--step-s", type=float, default=0.05)
    args = p.parse_args()
    drills = set(filter(None, args.drills.split(",")))
    rank = int(os.environ["RANK"])
    log = Path(args.dir, "events.jsonl")

    def event(kind: str, **kw: object) -> None:
        with log.open("a") as f:
            f.write(json.dumps({"t": time.time(), "rank": rank, "event": kind, **kw}) + "\n")

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    mon = NvrxMonitor.from_env()  # need_saved: timeouts stay the ones the environment sets
    mon.start()
    inc = mon.restart_count
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    event("start", incarnation=inc, version=mon.caps.version, device=str(dev), active=mon.active)
    a = torch.randn(1024, 1024, device=dev)
    for step in range(1, args.steps + 1):
        b = a @ a
        t = torch.tensor([float(b[0, 0].item() != 0)])
        dist.all_reduce(t)
        mon.step_done(step)
        if step == args.fault_step:
            if "crash" in drills and inc == 0 and rank == 1:
                event("crash", incarnation=inc, step=step)
                os.kill(os.getpid(), signal.SIGKILL)
            if "hang" in drills and inc == 1 and rank == 0:
                event("hang", incarnation=inc, step=step)
                time.sleep(3600)
            if "verdict" in drills and inc == 0 and rank == 0:
                sent = mon.request_shutdown("gpu-check: drill verdict")
                event("verdict", incarnation=inc, step=step, request_sent=sent)
                mon.close()
                return EXIT_SDC_VERDICT
        time.sleep(args.step_s)
    event("done", incarnation=inc, steps=args.steps)
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
