"""One rank of the in-process restart test (run by test_inprocess.py as a plain process, 3 of them).

MODE=clean: 12 steps. MODE=raise: rank 1 raises at step 7 of the first iteration; every rank restarts
in-process from the last "checkpoint" (step 5, kept in memory) and finishes. MODE=sdc: every rank exits
93 at step 7 (a shared verdict), which must not be restarted. Prints one JSON line per rank.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from training.nvrx.inprocess import Attempt, InprocessSettings, run

STEPS, CKPT_EVERY, FAULT_STEP = 12, 5, 7


def main() -> int:
    mode = os.environ["MODE"]
    saved = {"step": 0, "w": torch.zeros(4, dtype=torch.float64)}
    events: list[dict] = []

    def train(attempt: Attempt) -> dict:
        t0 = time.time()
        attempt.init_process_group()
        rank = dist.get_rank()
        events.append({"iteration": attempt.iteration, "start_step": saved["step"], "pg_s": time.time() - t0})
        w = saved["w"].clone()
        for step in range(saved["step"] + 1, STEPS + 1):
            g = torch.arange(4, dtype=torch.float64) * (rank + 1) * step
            dist.all_reduce(g)
            w = w * 0.9 + g / 100
            attempt.ping()
            if step % CKPT_EVERY == 0:
                saved.update(step=step, w=w.clone())
            if step == FAULT_STEP and attempt.iteration == 0:
                if mode == "raise" and rank == 1:
                    events.append({"raised_at": time.time()})
                    raise RuntimeError("injected transient failure")
                if mode == "sdc":
                    sys.stdout.write(json.dumps({"rank": rank, "sdc": True, "events": events}) + "\n")
                    sys.stdout.flush()
                    sys.exit(93)
        return {"rank": rank, "w": w.tolist(), "events": events, "end": time.time()}

    settings = InprocessSettings(
        gloo_timeout_s=3.0, soft_timeout_s=20, hard_timeout_s=25, heartbeat_timeout_s=10, barrier_timeout_s=40
    )
    out = run(train, settings)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
