"""Slurm layer benchmark: how long until a job runs, through Airflow and through sbatch alone, and how long
the incident path (drain + cancel + relaunch excluding the node) takes until the job runs again.

    python bench/bench_slurm.py [--runs N] [--skip-airflow]

Reuses the default stack (`longrun stack up`) when its Slurm and Airflow run; otherwise starts one in a
temporary state dir on a port range of its own and stops what it started. RUNNING is observed the same
way for every path: polling Slurm (`squeue --json`) every 50 ms for the job carrying the expected tag.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from longrun.airflow_rest import AirflowApiError, AirflowRest
from longrun.slurm import ops
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.models import JobState, JobStatus
from longrun.slurm.spec import JobSpec

BENCH_PORT_BASES = (21200, 21050)  # clear of the default stack (21800), tests (22000+), bench_checkpoints
DAG_ID = "example_slurm_job"


@contextmanager
def stack_env(need_airflow: bool) -> Iterator[dict[str, str]]:
    """The env of a running stack with Slurm (and Airflow when asked); started here if none runs."""
    from longrun.stack.layout import Layout, default_state_dir, ports_in_use
    from longrun.stack.stack import Stack

    parts = ["slurm", "s3", "airflow"] if need_airflow else ["slurm"]
    default = Stack(default_state_dir())
    if all(default.running(p) for p in parts):
        print(f"# reusing the running stack in {default.state_dir}")
        yield default.env()
        return
    with tempfile.TemporaryDirectory(prefix="lr-bench-") as tmp:
        base = next(
            (
                b
                for b in BENCH_PORT_BASES
                if not ports_in_use(Layout(state_dir=Path(tmp), port_base=b).all_ports())
            ),
            None,
        )
        if base is None:
            raise SystemExit(f"no free port range among {BENCH_PORT_BASES}")
        stack = Stack(Path(tmp), port_base=base)
        t0 = time.monotonic()
        stack.up(parts, say=lambda _line: None)
        print(f"# started {'+'.join(parts)} in a temporary state dir in {time.monotonic() - t0:.0f} s")
        try:
            yield stack.env()
        finally:
            stack.down(parts, say=lambda _line: None)


def wait_tagged_running(
    client: CliSlurmClient, prefix: str, *, timeout_s: float = 120
) -> tuple[float, JobState]:
    """Poll until the job tagged `prefix` is RUNNING; (monotonic time first seen running, its state)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for state in client.find_jobs(prefix):
            if state.status is JobStatus.RUNNING:
                return time.monotonic(), state
        time.sleep(0.05)
    raise SystemExit(f"no RUNNING job tagged {prefix} within {timeout_s} s")


def spec(name: str, tag: str, **kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        name=name,
        partition="debug",
        gpus_per_node=0,
        exclusive=False,
        time_limit_min=5,
        workdir=tempfile.gettempdir(),
        output="longrun-bench-%j.out",
        command=["sleep 30"],
        comment=tag,
    )
    return JobSpec(**{**base, **kw})  # type: ignore[arg-type]


def bench_sbatch(client: CliSlurmClient, runs: int, stamp: str) -> list[float]:
    out = []
    for i in range(runs):
        tag = f"longrun/bench/{stamp}/sbatch/-1/{i + 1}"
        t0 = time.monotonic()
        job = client.submit(spec("bench-sbatch", tag))
        t1, _ = wait_tagged_running(client, tag)
        out.append(t1 - t0)
        client.cancel(job)
    return out


def bench_airflow(client: CliSlurmClient, env: dict[str, str], runs: int) -> list[float]:
    api = AirflowRest.from_env(env)
    api.wait_dag_parsed(DAG_ID, timeout=180)
    api.unpause(DAG_ID)
    out = []
    for _ in range(runs):
        t0 = time.monotonic()
        run_id = api.trigger(DAG_ID)
        t1, _ = wait_tagged_running(client, f"longrun/{DAG_ID}/{run_id}/submit/")
        out.append(t1 - t0)
        try:
            state = api.wait_run(DAG_ID, run_id, timeout=180, interval=0.5)
        except AirflowApiError as e:
            state = f"unfinished ({e})"
        if state != "success":
            print(f"# warning: run {run_id} ended {state}")
    return out


def moved_off(node: str) -> Callable[[JobState], bool]:
    return lambda s: s.status is JobStatus.RUNNING and node not in s.nodes


def bench_incident(client: CliSlurmClient, runs: int, stamp: str, how: str) -> list[float]:
    """From 'drain the suspect' to 'the job runs again without it'."""
    out = []
    for i in range(runs):
        tag = f"longrun/bench/{stamp}/{how}/-1/{i + 1}"
        job = client.submit(spec("bench-incident", tag, nodes=3))
        _, state = wait_tagged_running(client, tag)
        suspect = state.nodes[1]
        t0 = time.monotonic()
        client.drain(suspect, f"longrun:bench:{stamp}")
        if how == "relaunch":
            new_tag = f"longrun/bench/{stamp}/{how}-new/-1/{i + 1}"
            new_spec = spec("bench-incident", new_tag, nodes=3)
            jobs = [job, ops.cancel_and_relaunch(client, job, new_spec, (suspect,))]
            t1, again = wait_tagged_running(client, new_tag)
        else:
            ops.requeue_excluding(client, job, (suspect,))
            jobs = [job]
            again = ops.wait_for(client, job, moved_off(suspect), timeout_s=60, poll_s=0.05)
            t1 = time.monotonic()
        assert suspect not in again.nodes, again
        out.append(t1 - t0)
        for j in jobs:
            client.cancel(j)
        client.resume(suspect)
        time.sleep(1)  # the node reads NOT_RESPONDING for ~0.5 s after a resume
    return out


def line(label: str, xs: list[float]) -> str:
    return f"{label:<52} median {statistics.median(xs):6.2f} s  (n={len(xs)}; min {min(xs):.2f}, max {max(xs):.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="repetitions per measurement (default 5)")
    p.add_argument("--skip-airflow", action="store_true", help="measure the Slurm paths only")
    args = p.parse_args(argv)
    print("$ python bench/bench_slurm.py " + " ".join(sys.argv[1:] if argv is None else argv))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    with stack_env(need_airflow=not args.skip_airflow) as env:
        os.environ.update(env)
        client = CliSlurmClient(slurm_conf=env["SLURM_CONF"])
        print(f"# Slurm {client.version()} (CLI backend), 4 nodes on one host, {os.cpu_count()} cores")
        sb = bench_sbatch(client, args.runs, stamp)
        print(line("submit -> RUNNING, sbatch alone", sb))
        if not args.skip_airflow:
            af = bench_airflow(client, env, args.runs)
            print(line(f"submit -> RUNNING, through Airflow ({DAG_ID})", af))
            print(
                f"{'ratio Airflow / sbatch (medians)':<52} x{statistics.median(af) / statistics.median(sb):.1f}"
            )
        rl = bench_incident(client, args.runs, stamp, "relaunch")
        print(line("drain + cancel + relaunch excluding -> RUNNING", rl))
        rq = bench_incident(client, args.runs, stamp, "requeue")
        print(line("drain + requeue-hold/exclude/release -> RUNNING", rq))
    return 0


if __name__ == "__main__":
    sys.exit(main())
