"""The batch script's supervisor for a job that holds spare nodes: recover inside the allocation.

    python -m training.spares.supervisor --run R --width 3 --spares 1 --wait-s 120 --step 'srun ... ft_launcher ...'

It runs the training step (`--step`, a bash script) on `width` nodes of the job's allocation. When the
step ends with the SDC verdict (exit 93) and a node beyond the step's is still in the allocation, it
waits, at most `--wait-s`, for the orchestrator's directive for this job and the next attempt
(training.spares.directive), checks it, and runs the step again on the directed nodes from the directed
checkpoint: no new job, no queue. No spare, no directive in time, or a directive it must refuse: it exits
93, and `sdc_incident` falls back to the full relaunch. Any other exit code ends the job with that code.

A warm standby (training.spares.standby) hides the next step's start-up behind the incident: while a step runs
the supervisor looks for its alert in the store every `--poll-s`; once it is there (the alerting step is
still ending: checkpoint upload, teardown) the next attempt's step starts on the predicted nodes, and its
trainer waits for the directive. A directive for exactly those nodes is followed by that step; any other
directive, a refused one, none, or a step that ends without the verdict stops it (SIGTERM to its process
group, then SIGKILL), and the supervisor goes on as without a standby. `--standby-at verdict` starts
the standby only once the step has ended (where its start-up would take CPUs from the ending step);
`--no-standby` starts each step only after its directive.

The step sees LONGRUN_STEP_NODES (comma list), LONGRUN_STEP_NNODES, LONGRUN_ATTEMPT (0 first),
LONGRUN_RESUME_FROM (empty when starting fresh or as a standby) and LONGRUN_STANDBY_WAIT_S (set only for
a standby: the step script hands it to the entrypoint as LONGRUN_AWAIT_DIRECTIVE_S); it must not re-inject a drill when LONGRUN_ATTEMPT > 0.
Loops are bounded: at most `spares` relaunches, each wait bounded, each stop bounded.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from subprocess import Popen

from training.records import signing
from training.records.schema import EXIT_SDC_VERDICT, store_key
from training.spares import standby as warm
from training.spares.directive import Directive, directive_path, read_directive
from training.store.factory import store_from_env
from training.store.interface import ObjectStore, StoreError, StoreUnavailable

log = logging.getLogger("training.supervisor")

#: How long a standby step gets to end after SIGTERM (ft_launcher stops its workers, srun its tasks)
#: before the supervisor kills what is left of it.
STOP_S = 30.0


def _group_alive(proc: Popen) -> bool:
    """Whether anything of the process group `proc` leads is still running (srun may outlive bash)."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed node list (n[1-3],x) as names, through `scontrol show hostnames`."""
    if not nodelist:
        return []
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
    )
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def allocation(job_id: str) -> list[str]:
    """The job's nodes now (the orchestrator may have released one): squeue's node list, expanded."""
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True, timeout=30, check=True
    )
    return expand_nodelist(out.stdout.strip())


@dataclass(slots=True, kw_only=True)
class Supervisor:
    run: str
    job_id: str
    width: int
    spares: int
    wait_s: float
    poll_s: float
    step: str
    store: ObjectStore
    resume_from: str = ""
    include: tuple[str, ...] = ()
    nodes_now: Callable[[], list[str]] | None = None
    standby: bool = True
    standby_at: str = "alert"
    stop_s: float = STOP_S
    excluded: set[str] = field(default_factory=set)
    this_job: signing.ThisJob | None = None
    """Whose alerts the alert watch counts (`signing.alert_not_mine`): by default this job's key from
    the environment and `job_id`."""

    def __post_init__(self) -> None:
        if self.this_job is None:
            self.this_job = signing.ThisJob.from_env(job_id=self.job_id)

    def _allocation(self) -> list[str]:
        return (self.nodes_now or (lambda: allocation(self.job_id)))()

    def _start(
        self, nodes: Sequence[str], attempt: int, resume_from: str, *, standby_s: float = 0.0
    ) -> Popen:
        env = dict(os.environ)
        env.update(
            LONGRUN_STEP_NODES=",".join(nodes),
            LONGRUN_STEP_NNODES=str(len(nodes)),
            LONGRUN_ATTEMPT=str(attempt),
            LONGRUN_RESUME_FROM=resume_from,
        )
        env.pop("LONGRUN_STANDBY_WAIT_S", None)
        if standby_s:
            env["LONGRUN_STANDBY_WAIT_S"] = f"{standby_s:g}"
        what = "standby until its directive" if standby_s else f"from {resume_from or 'scratch'}"
        print(f"longrun-supervisor: attempt {attempt} on {','.join(nodes)} {what}", flush=True)
        # a standby may have to be stopped: its own process group, so the stop reaches srun and nothing else
        return subprocess.Popen(["bash", "-c", self.step], env=env, start_new_session=bool(standby_s))

    def _start_standby(self, attempt: int, watch: warm.AlertWatch) -> tuple[Popen, list[str]] | None:
        """The next attempt's step on the predicted nodes, waiting for its directive; None when no prediction."""
        try:
            suspects = watch.suspects()
            nodes = warm.predicted_nodes(self._allocation(), self.excluded | suspects, self.width)
        except (StoreError, OSError, subprocess.SubprocessError) as e:
            print(f"longrun-supervisor: no standby ({e})", flush=True)
            return None
        if not suspects or nodes is None:
            print(
                "longrun-supervisor: no standby (no suspect node to leave out, or too few nodes)", flush=True
            )
            return None
        # the trainer waits a little longer than this supervisor, which stops it first when not directed
        return self._start(nodes, attempt, "", standby_s=self.wait_s + self.stop_s), nodes

    def _wait_watching(
        self, step: Popen, attempt: int, watch: warm.AlertWatch | None
    ) -> tuple[int, tuple[Popen, list[str]] | None, bool]:
        """Wait for the running step to end: (its exit code, the next attempt's standby, whether the
        standby was decided). Meanwhile, once the step's alert is in the store, the standby starts: its
        start-up then overlaps the whole incident, from the alert on, not only what is left after the
        alerting step has ended. No watch (standby off, no spare left): a plain wait."""
        standby, decided = None, watch is None
        while True:
            try:
                return step.wait(timeout=self.poll_s), standby, decided
            except subprocess.TimeoutExpired:
                pass
            if decided:
                continue
            assert watch is not None
            try:
                alerted = bool(watch.suspects())
            except (StoreError, OSError):
                continue  # the look after the step's end says why, if it persists
            if alerted:
                decided = True
                print(
                    f"longrun-supervisor: attempt {attempt} raised an alert while its step ends", flush=True
                )
                standby = self._start_standby(attempt + 1, watch)

    def _stop(self, proc: Popen, why: str) -> None:
        """End a standby step and everything it started (srun forwards the signal to the step's tasks)."""
        print(f"longrun-supervisor: stopping the standby ({why})", flush=True)
        for sig, grace in ((signal.SIGTERM, self.stop_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _group_alive(proc):
                time.sleep(0.1)
            if not _group_alive(proc):
                break
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # unkillable (a hung mount): the next step runs beside it
            print(f"longrun-supervisor: the standby (pid {proc.pid}) did not end after SIGKILL", flush=True)

    def wait_for_directive(self, attempt: int) -> Directive | None:
        """The directive of `attempt`, once it is there; None when the wait runs out or the directive is
        unusable. A store that does not answer (StoreUnavailable) is looked at again until the deadline:
        an outage is not a refusal (a fault-matrix cell saw the job give its spare up, and end, over one)."""
        deadline = time.monotonic() + self.wait_s
        said = False
        while True:
            try:
                found = read_directive(self.store, run=self.run, job_id=self.job_id, attempt=attempt)
            except StoreUnavailable as e:
                if not said:
                    print(
                        f"longrun-supervisor: store unavailable, still waiting for the directive: {e}",
                        flush=True,
                    )
                    said = True
                found = None
            except (StoreError, ValueError) as e:  # unreadable or malformed: refused, not retried forever
                key = store_key(self.run, directive_path(self.job_id, attempt))
                print(f"longrun-supervisor: directive {key} unusable: {e}", flush=True)
                return None
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.poll_s)

    def __call__(self) -> int:
        held = self._allocation()
        # nodes that must train in the first attempt (a drill's target node), then the rest in order
        first = [n for n in held if n in self.include] + [n for n in held if n not in self.include]
        nodes = [n for n in held if n in first[: self.width]]
        if len(nodes) < self.width:
            print(f"longrun-supervisor: allocation {nodes} is narrower than {self.width} node(s)", flush=True)
            return 1
        attempt, resume, running = 0, self.resume_from, None
        while True:
            started = time.time()
            step = running or self._start(nodes, attempt, resume)
            spare_left = attempt < self.spares
            watch = (
                warm.AlertWatch(self.store, self.run, since=started - 1.0, job=self.this_job)
                if self.standby and spare_left
                else None
            )
            early = watch if self.standby_at == "alert" else None
            rc, standby, decided = self._wait_watching(step, attempt, early)
            if rc != EXIT_SDC_VERDICT:
                if standby:
                    self._stop(standby[0], f"attempt {attempt} ended with {rc}, not the verdict")
                return rc
            if not spare_left:
                print(
                    "longrun-supervisor: SDC verdict and no relaunch left inside the job: exit 93", flush=True
                )
                return EXIT_SDC_VERDICT
            t0 = time.monotonic()
            # at the verdict: by choice, or the alert came too late for the watch, or the watch failed
            if watch is not None and (early is None or not decided):
                standby = self._start_standby(attempt + 1, watch)
            print(f"longrun-supervisor: SDC verdict; waiting up to {self.wait_s:g} s for the directive of "
                  f"attempt {attempt + 1}", flush=True)  # fmt: skip
            directive = self.wait_for_directive(attempt + 1)
            held = self._allocation() if directive else []
            why = "no directive in time" if directive is None else directive.refusal(
                run=self.run, job_id=self.job_id, attempt=attempt + 1, allocation=held, width=self.width
            )  # fmt: skip
            if why:
                if standby:
                    self._stop(standby[0], why)
                print(f"longrun-supervisor: {why}: exit 93 (full relaunch)" if directive is None
                      else f"longrun-supervisor: directive REFUSED ({why}): exit 93", flush=True)  # fmt: skip
                return EXIT_SDC_VERDICT
            assert directive is not None
            print(f"longrun-supervisor: directive of incident {directive.incident_id} after "
                  f"{time.monotonic() - t0:.1f} s", flush=True)  # fmt: skip
            # in the allocation's order: srun numbers a step's nodes that way (node 0 hosts the rendezvous)
            nodes = [n for n in held if n in directive.nodes]
            attempt, resume, running = attempt + 1, directive.resume_from, None
            self.excluded.update(directive.exclude)
            # a standby that already ended trained from this directive (0: done, 93: a new verdict); any
            # other end (killed, crashed, never directed) leaves the attempt to a fresh step
            if standby and set(standby[1]) == set(nodes) and standby[0].poll() in (None, 0, EXIT_SDC_VERDICT):
                print("longrun-supervisor: the standby is directed: it trains", flush=True)
                running = standby[0]
            elif standby:
                self._stop(standby[0], f"directed to {','.join(nodes)}, not {','.join(standby[1])}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m training.spares.supervisor", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--run-name", required=True, help="run name")
    p.add_argument("--job-id", default=os.environ.get("SLURM_JOB_ID", ""), help="default: $SLURM_JOB_ID")
    p.add_argument("--width", type=int, required=True, help="nodes per training step")
    p.add_argument("--spares", type=int, required=True, help="relaunches inside the job at most")
    p.add_argument("--wait-s", type=float, default=120.0, help="longest wait for a directive")
    p.add_argument("--poll-s", type=float, default=0.5, help="alert and directive poll interval")
    p.add_argument("--resume-from", default="", help="checkpoint of the first step")
    p.add_argument("--step", required=True, help="bash script of one training step")
    p.add_argument("--include", action="append", default=[], help="a node the first attempt must use")
    p.add_argument("--no-standby", action="store_true", help="start each attempt only after its directive")
    p.add_argument(
        "--standby-at",
        choices=("alert", "verdict"),
        default="alert",
        help="start the standby at the step's alert (beside the ending step) or at its verdict (after it)",
    )
    args = p.parse_args(argv)
    if not args.job_id.isdigit() or args.width < 1 or args.spares < 0 or not 0 < args.wait_s <= 3600:
        print("longrun-supervisor: needs a job id, --width >= 1, --spares >= 0, 0 < --wait-s <= 3600",
              file=sys.stderr)  # fmt: skip
        return 2
    sup = Supervisor(
        run=args.run_name, job_id=args.job_id, width=args.width, spares=args.spares, wait_s=args.wait_s,
        poll_s=args.poll_s, step=args.step, store=store_from_env(), resume_from=args.resume_from,
        include=tuple(args.include), standby=not args.no_standby, standby_at=args.standby_at,
    )  # fmt: skip
    return sup()


if __name__ == "__main__":
    sys.exit(main())
