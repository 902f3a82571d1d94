"""Incident recovery on the local stack: alert -> relaunched job RUNNING, median of N drills, with its
breakdown, and the steps lost per incident.

    .venv/bin/python bench/bench_incident.py [--drills N] [--kind nan|weight-flip|sick-node]

Each drill is a full 3-node `training_run` through Airflow's REST API, as in the e2e test. The breakdown
comes from the incident record's timeline (seconds after the alert record was written):
    sensor     the monitor's trigger saw the alert (poll interval + store listing)
    handover   the monitor task resumes, hands over; the sdc_incident run starts
    attribute  evidence -> node
    drain      rate-limit ledger + scontrol drain
    freeze     (beside attribute + drain) the job exits by itself after its uploads (exit 93)
    pick       gate still-uploading checkpoints, pre-incident checkpoint, demote later ones
    submit     sbatch of the relaunch until Slurm reports it RUNNING
    diagnosis  (beside pick + submit, not on the recovery path) reference probe (first incident per
               partition) + probe on the node in a MAINT reservation, drained again with the verdict
Most of each phase here is Airflow task start-up on a 2-core machine shared with other work: compare
phases, not totals, across machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from longrun.drill import Rest, prepare, return_to_service, run_drill
from longrun.slurm.factory import make_client
from longrun.stack.stack import Stack

from training.records.orchestrator import Incident
from training.store.factory import store_from_env

CONFIG = {
    "nodes": 3,
    "gpus_per_node": 0,
    "steps": 30,
    "checkpoint_every": 10,
    "recompute_every": 5,
    "vote_every": 5,
}
DRILL = {
    "nan": {"kind": "nan", "step": 13, "target": "2"},
    "weight-flip": {"kind": "weight-flip", "step": 13, "target": "1"},
    "sick-node": {"kind": "sick-node", "step": 17, "target": "n2"},
}
# (name, events whose latest time starts the phase (empty: the alert record's time), event that ends it).
# freeze runs beside attribute + drain; diagnosis runs beside pick + submit (not on the recovery path).
PHASES = (
    ("sensor", (), "alert_seen"),
    ("handover", ("alert_seen",), "opened"),
    ("attribute", ("opened",), "attributed"),
    ("drain", ("attributed",), "drained"),
    ("freeze", ("opened",), "frozen"),
    ("pick", ("drained", "frozen"), "picked"),
    ("submit", ("picked",), "relaunched_running"),
    ("diagnosis", ("drained", "frozen"), "diagnosed"),
)


def phases(incident: Incident) -> dict[str, float]:
    t = {e.event: e.time for e in incident.timeline if e.time is not None}
    t_alert = float(incident.alert["time"])
    out = {}
    for name, starts, end in PHASES:
        if end not in t or any(s not in t for s in starts):
            continue
        out[name] = t[end] - max([t[s] for s in starts], default=t_alert)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drills", type=int, default=int(os.environ.get("LONGRUN_BENCH_DRILLS", "3")))
    p.add_argument("--kind", default="nan", choices=sorted(DRILL))
    args = p.parse_args(argv)
    stack = Stack()
    stack.up(say=lambda _line: None)
    os.environ.update(stack.env())
    env = stack.env()
    rest = Rest.from_env(env)
    prepare(rest)
    client = make_client(backend="cli", slurm_conf=env["SLURM_CONF"])
    store = store_from_env()
    totals, lost, per_phase = [], [], {name: [] for name, _s, _e in PHASES}
    for i in range(args.drills):
        return_to_service(client, say=lambda _line: None)
        run = f"bench-{args.kind}-{time.strftime('%H%M%S')}-{i}"
        r = run_drill(
            rest, store, {**CONFIG, "run_name": run, "drill": DRILL[args.kind]}, say=lambda _line: None
        )
        assert r.incident is not None, f"{run}: no incident"
        totals.append(float(r.recover_s))
        lost.append(int(r.lost_steps))
        for name, secs in phases(r.incident).items():
            per_phase[name].append(secs)
        print(f"drill {i + 1}/{args.drills} {run}: alert -> RUNNING {r.recover_s:.1f} s, lost {r.lost_steps} steps, "
              f"detected at step {r.detection_step}; phases {({k: round(v, 1) for k, v in phases(r.incident).items()})}",
              flush=True)  # fmt: skip
    return_to_service(client, say=lambda _line: None)
    print(f"\n{args.kind} drills: {args.drills}; config {CONFIG}")
    print(
        f"alert -> relaunched RUNNING: median {statistics.median(totals):.1f} s (min {min(totals):.1f}, max {max(totals):.1f})"
    )
    for name, _s, _e in PHASES:
        if per_phase[name]:
            print(f"  {name:<10} median {statistics.median(per_phase[name]):6.1f} s")
    print(f"steps lost per incident: median {statistics.median(lost)} (all: {lost})")
    print(f"command: .venv/bin/python bench/bench_incident.py --drills {args.drills} --kind {args.kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
