"""Time to recover, both paths side by side: hot spare (spare_nodes=1, recovery inside the job) and requeue
(spare_nodes=0, cancel + new job), on an idle cluster and then with a competing job queued for the nodes
the incident frees. The figure is alert written -> first healthy step of the relaunch, read from the
trainer's segment records (longrun.incident.recovery), not Slurm's RUNNING.

    .venv/bin/python bench/bench_recovery.py [--drills N] [--state-dir DIR] [--competitor-s S] \
        [--paths hot,requeue] [--states idle,busy]

Each drill is a full `training_run` through Airflow's REST API (sick-node on n2, 3 training nodes of the
4-node cluster). "busy": the moment the alert appears, a competing 3-node job (another workload; a sleep)
is submitted; it queues for the nodes the incident frees. The requeue path's relaunch then waits behind
it; the hot-spare job never gives its nodes back. Medians and the ratio hot/requeue are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from longrun.drill import DRILL_CONF, Rest, prepare, return_to_service, run_drill
from longrun.slurm.client import SlurmClient
from longrun.slurm.factory import make_client
from longrun.slurm.spec import JobSpec

from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import ObjectStore

DRILL = {"kind": "sick-node", "step": 17, "target": "n2"}


class Competitor:
    """Submits a competing job as soon as the run's first alert is in the store; cancels it at the end."""

    def __init__(self, client: SlurmClient, store: ObjectStore, run: str, *, seconds: int, workdir: str):
        self.client, self.store, self.run, self.seconds, self.workdir = client, store, run, seconds, workdir
        self.job_id: int | None = None
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        deadline = time.monotonic() + 900
        prefix = schema.store_key(self.run, "alerts/")
        while not self._stop.is_set() and time.monotonic() < deadline:
            if any(True for _ in self.store.list(prefix)):
                # whole nodes (CPU jobs share nodes otherwise), and not longrun's tag: another workload
                spec = JobSpec(
                    name="competitor", partition="debug", command=(f"sleep {self.seconds}",), nodes=3,
                    gpus_per_node=0, exclusive=True, time_limit_min=10, workdir=self.workdir,
                    output="competitor-%j.out", comment="other-workload",
                )  # fmt: skip
                try:
                    self.job_id = self.client.submit(spec)
                except Exception as e:  # reported by __exit__: a "busy" figure without a competitor is void
                    self.error = e
                return
            time.sleep(0.25)

    def __enter__(self) -> Competitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.job_id is not None:
            self.client.cancel(self.job_id)
        if self.error is not None or self.job_id is None:
            raise RuntimeError(f"the competing job was not submitted ({self.error}): no busy figure")


def one(rest: Rest, client: SlurmClient, store: ObjectStore, *, spares: int, busy: bool, i: int,
        competitor_s: int, workdir: str) -> dict[str, Any]:  # fmt: skip
    return_to_service(client, say=lambda _line: None)
    run = f"benchrec-{'hot' if spares else 'requeue'}-{'busy' if busy else 'idle'}-{time.strftime('%H%M%S')}-{i}"
    conf = {**DRILL_CONF, "run_name": run, "spare_nodes": spares, "drill": DRILL}
    if busy:
        with Competitor(client, store, run, seconds=competitor_s, workdir=workdir):
            r = run_drill(rest, store, conf, say=lambda _line: None)
    else:
        r = run_drill(rest, store, conf, say=lambda _line: None)
    assert r.incident is not None, f"{run}: no incident"
    rec = r.recovery
    return {
        "run": run,
        "to_training_s": r.to_training_s,
        "to_running_s": r.recover_s,
        "in_job": bool(r.incident.relaunch.in_job),
        "resumed_as_picked": rec.get("resumed_as_picked"),
        "lost_steps": rec.get("lost_steps"),
        "milestones_s": rec.get("milestones_s"),
    }


PATHS = {"hot": ("hot spare", 1), "requeue": ("requeue", 0)}


def run_bench(rest: Rest, client: SlurmClient, store: ObjectStore, *, drills: int, competitor_s: int,
              workdir: str, say: Any = print, states: tuple[str, ...] = ("idle", "busy"),
              paths: tuple[str, ...] = ("hot", "requeue")) -> dict[tuple[str, str], list[float]]:  # fmt: skip
    out: dict[tuple[str, str], list[float]] = {}
    for state in states:
        for path, spares in (PATHS[p] for p in paths):
            for i in range(drills):
                r = one(rest, client, store, spares=spares, busy=state == "busy", i=i,
                        competitor_s=competitor_s, workdir=workdir)  # fmt: skip
                assert r["resumed_as_picked"] is True, r
                assert r["in_job"] == (spares > 0), r
                out.setdefault((path, state), []).append(float(r["to_training_s"]))
                say(f"{path:>9} {state}: {r['run']}: alert -> first healthy step {r['to_training_s']} s "
                    f"(alert -> RUNNING {r['to_running_s']} s), lost {r['lost_steps']} steps; {r['milestones_s']}")  # fmt: skip
    return_to_service(client, say=lambda _line: None)
    for state in states:
        medians = {path: statistics.median(out[(path, state)]) for path, _ in (PATHS[p] for p in paths)}
        line = ", ".join(f"{path} {m:.1f} s" for path, m in medians.items())
        if len(medians) == 2:
            line += f", ratio hot/requeue {medians['hot spare'] / medians['requeue']:.2f}"
        say(f"{state}: alert -> first healthy step, median of {drills}: {line}")
    return out


def scheduler_has_torch(stack) -> bool | None:  # noqa: ANN001
    """Whether the running scheduler has imported torch (None: no scheduler found)."""
    from longrun.stack.airflow import torch_mapped

    for st in stack.airflow.status():
        if st.name == "scheduler" and st.pid:
            try:
                return torch_mapped(st.pid)
            except OSError:
                return None
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drills", type=int, default=int(os.environ.get("LONGRUN_BENCH_DRILLS", "1")))
    p.add_argument("--state-dir", type=Path, default=None, help="the stack's state dir (default: longrun's)")
    p.add_argument("--competitor-s", type=int, default=90, help="how long the competing job runs")
    p.add_argument("--paths", default="hot,requeue", help="which recovery paths (a side-by-side needs both)")
    p.add_argument("--states", default="idle,busy", help="which cluster states")
    args = p.parse_args(argv)
    paths, states = tuple(args.paths.split(",")), tuple(args.states.split(","))
    if not paths or set(paths) - set(PATHS) or not states or set(states) - {"idle", "busy"}:
        p.error("--paths takes hot and/or requeue, --states idle and/or busy")
    from longrun.stack.stack import Stack

    # As a test session's stack: the scheduler imports torch once, so the incident's tasks that validate a
    # checkpoint do not import it again (an orchestrator whose workers import torch before they fork
    # does the same). A running stack keeps what it was started with; the line below says which.
    stack = Stack(args.state_dir, preload_torch=True) if args.state_dir else Stack(preload_torch=True)
    stack.up(say=lambda _line: None)
    print(f"stack {stack.state_dir}: scheduler has torch imported: {scheduler_has_torch(stack)}")
    env = stack.env()
    os.environ.update(env)
    rest = Rest.from_env(env)
    prepare(rest)
    client = make_client(backend="cli", slurm_conf=env["SLURM_CONF"])
    run_bench(rest, client, store_from_env(), drills=args.drills, competitor_s=args.competitor_s,
              workdir=str(stack.state_dir), paths=paths, states=states)  # fmt: skip
    print(f"command: .venv/bin/python bench/bench_recovery.py --drills {args.drills} --competitor-s "
          f"{args.competitor_s} --paths {','.join(paths)} --states {','.join(states)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
