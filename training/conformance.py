"""The conformance check of an entrypoint: run it on 3 local CPU ranks before it goes to the cluster.

    longrun entrypoint check [options] -- python -m my.module --flag
    python -m training.conformance [options] -- python path/to/train.py     (the job side alone, no Airflow)

`<command...>` is the argv of one rank, run as given (a list, never a shell), once per rank, in the current
directory. Each rank gets what a launch gives it (docs/contracts.md, "The job's environment"): RANK,
WORLD_SIZE=3, LOCAL_RANK=0, MASTER_ADDR/MASTER_PORT, LONGRUN_NODE_NAMES=n1,n2,n3, a local store
(LONGRUN_STORE_DIR; the inherited AWS_*, SLURM* and LONGRUN_* variables are removed), and LONGRUN_RUN_NAME,
LONGRUN_RUN_DIR, LONGRUN_STEPS, the cadences and LONGRUN_SEED. Three runs, each bounded by `--timeout-s`:

    A clean    exit 0 on every rank; a segment with its first healthy step, progress, check records of every
               check from every rank (all pass), checkpoints with manifests and save records, the report
               (final step, final fingerprint), no alert, and the records in the store
    B resume   from A's checkpoint at (or before) steps/2, in a fresh run dir and store: exit 0, a segment that
               starts at that step, and a final fingerprint equal to A's (a bit-identical resume: the data
               loader, the scheduler and the RNG state are restored)
    C drill    LONGRUN_FAULTS=<drill> (default weight-flip at a vote step on rank 1): exit 93 on every rank,
               the fault record, and one alert of the intended check naming rank 1 / node n2

Then a table, one row per expectation (ok, MISSING or WRONG, and why), and a verdict line. Exit code 0 only
when every expectation holds; 1 when one does not; 2 for bad usage. Every process started here is killed
by its PID (and its process group) on a timeout or an error. Records are read with the project's own
readers (`training.records`), the same ones the orchestrator uses. No torch, no Airflow, no `longrun`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.records import loads as load_record
from training.records import schema

PROG = "longrun entrypoint check"
WORLD = 3
NODES = ("n1", "n2", "n3")
#: The check meant to catch each SDC drill kind (crash and hang are not SDC: no check catches them).
INTENDED_CHECK = {
    "nan": "finite",
    "inf": "finite",
    "scale": "recompute",
    "sick-node": "recompute",
    "weight-flip": "weight_vote",
}
NO_RECORDS = (
    "wrote no longrun records: the entrypoint must guard its loop with training.api (docs/adopting.md)"
)
#: After one rank has exited with an error, the others get this long before they are killed (they may be
#: stuck in a collective with the dead rank).
FAILED_RANK_GRACE_S = 60.0
STDERR_TAIL_LINES = 15

OK, MISSING, WRONG = "ok", "MISSING", "WRONG"

CHECK_HINTS = {
    "finite": "is the entrypoint not stepping through training.api (Guard.run or Guard.step)?",
    "recompute": "is recompute_every 0, or is the entrypoint not using training.api?",
    "weight_vote": "are vote_every and checkpoint_every 0, or is the entrypoint not using training.api?",
}


# ---- settings ----------------------------------------------------------------------------------------


class UsageError(ValueError):
    """Options that cannot make a conformance run; the message says why."""


@dataclass(frozen=True, slots=True)
class Drill:
    """The fault of run C and what must catch it."""

    kind: str
    step: int
    rank: int
    node: str

    @property
    def check(self) -> str:
        return INTENDED_CHECK[self.kind]

    @property
    def spec(self) -> str:
        target = self.node if self.kind == "sick-node" else str(self.rank)
        return f"{self.kind}:{self.step}:{target}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    steps: int
    checkpoint_every: int
    recompute_every: int
    vote_every: int
    seed: int
    drill: Drill
    timeout_s: float

    @property
    def resume_step(self) -> int:
        """The checkpoint run B resumes from: the last one at or before steps/2."""
        return (self.steps // 2) // self.checkpoint_every * self.checkpoint_every

    def job_env(self, run: str, run_dir: Path) -> dict[str, str]:
        return {
            "LONGRUN_RUN_NAME": run,
            "LONGRUN_RUN_DIR": str(run_dir),
            "LONGRUN_STEPS": str(self.steps),
            "LONGRUN_CHECKPOINT_EVERY": str(self.checkpoint_every),
            "LONGRUN_RECOMPUTE_EVERY": str(self.recompute_every),
            "LONGRUN_VOTE_EVERY": str(self.vote_every),
            "LONGRUN_SEED": str(self.seed),
        }


def _vote_steps(s: argparse.Namespace) -> list[int]:
    return [
        step
        for step in range(1, s.steps + 1)
        if (s.vote_every and step % s.vote_every == 0) or step % s.checkpoint_every == 0
    ]


def parse_drill(spec: str | None, s: argparse.Namespace) -> Drill:
    """`KIND:STEP:TARGET` (TARGET a rank 0-2 or a node n1-n3), checked against the cadences; None: weight-flip
    on rank 1 at the first vote step after steps/2."""
    if spec is None:
        votes = _vote_steps(s)
        later = [v for v in votes if v > s.steps // 2]
        return Drill(kind="weight-flip", step=(later or votes)[0], rank=1, node=NODES[1])
    parts = spec.strip().split(":")
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"--drill {spec!r} is not KIND:STEP:TARGET (e.g. weight-flip:8:1 or sick-node:4:n2)")
    kind, step_s, target = parts
    if kind not in INTENDED_CHECK:
        raise UsageError(
            f"--drill kind {kind!r}: one of {', '.join(INTENDED_CHECK)} (an SDC drill a check catches)"
        )
    if not step_s.isdigit() or not 1 <= int(step_s) <= s.steps:
        raise UsageError(f"--drill step {step_s!r} must be a step from 1 to --steps {s.steps}")
    step = int(step_s)
    if target.isdigit() and int(target) < WORLD:
        rank = int(target)
    elif target in NODES:
        rank = NODES.index(target)
    else:
        raise UsageError(f"--drill target {target!r}: a rank 0-{WORLD - 1} or a node {', '.join(NODES)}")
    audits = [a for a in range(step, s.steps + 1) if s.recompute_every and a % s.recompute_every == 0]
    if kind == "scale" and step not in audits:
        raise UsageError(
            f"--drill scale at step {step}: only a recompute step (a multiple of --recompute-every) sees it"
        )
    if kind == "sick-node" and not audits:
        raise UsageError(
            f"--drill sick-node from step {step}: no recompute step at or after it within --steps"
        )
    if kind == "weight-flip" and not [v for v in _vote_steps(s) if v >= step]:
        raise UsageError(f"--drill weight-flip at step {step}: no weight vote at or after it within --steps")
    return Drill(kind=kind, step=step, rank=rank, node=NODES[rank])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [options] -- <command...>",
        description="Run an entrypoint on 3 local CPU ranks (clean, resumed from its own checkpoint, and with a "
        "drill) and report, record by record, what is missing. Exit 0 only when everything holds.",
    )
    p.add_argument("--steps", type=int, default=12, help="LONGRUN_STEPS of each run (default 12)")
    p.add_argument("--checkpoint-every", type=int, default=4, help="LONGRUN_CHECKPOINT_EVERY (default 4)")
    p.add_argument("--recompute-every", type=int, default=4, help="LONGRUN_RECOMPUTE_EVERY (default 4)")
    p.add_argument("--vote-every", type=int, default=4, help="LONGRUN_VOTE_EVERY (default 4)")
    p.add_argument("--seed", type=int, default=0, help="LONGRUN_SEED (default 0)")
    p.add_argument(
        "--drill", metavar="KIND:STEP:TARGET",
        help="run C's fault (default weight-flip at the first vote step after steps/2, on rank 1)",
    )  # fmt: skip
    p.add_argument(
        "--timeout-s", type=float, default=300.0, help="limit of each run, in seconds (default 300)"
    )
    p.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="work in DIR (new or empty) and keep it; default: a temporary directory",
    )
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    if args.steps < 2:
        raise UsageError("--steps must be at least 2")
    for name in ("checkpoint_every", "recompute_every", "vote_every"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0")
    if not 1 <= args.checkpoint_every <= args.steps // 2:
        raise UsageError(
            f"--checkpoint-every must be from 1 to steps/2 = {args.steps // 2}: run B resumes from a checkpoint "
            "at or before steps/2"
        )
    if not args.timeout_s > 0:
        raise UsageError("--timeout-s must be > 0")
    return Settings(
        steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        recompute_every=args.recompute_every,
        vote_every=args.vote_every,
        seed=args.seed,
        drill=parse_drill(args.drill, args),
        timeout_s=args.timeout_s,
    )


# ---- launching -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env() -> dict[str, str]:
    """The inherited environment without anything that would point a rank elsewhere (a real store, a Slurm
    job, another run's settings, another launcher's rendezvous)."""
    drop = ("AWS_", "LONGRUN_", "SLURM", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for k in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        env.pop(k, None)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", LONGRUN_NODE_NAMES=",".join(NODES))
    return env


@dataclass(slots=True, kw_only=True)
class Launch:
    """One run of the entrypoint on 3 ranks."""

    name: str
    run: str
    run_dir: Path
    store_dir: Path
    logs: Path
    rcs: list[int | None] = field(default_factory=list)
    """Each rank's exit code (negative: a signal; None: never ended, killed)."""
    timed_out: bool = False
    killed_after_failure: bool = False
    wall_s: float = 0.0

    def stderr_tail(self, rank: int) -> str:
        try:
            lines = (self.logs / f"r{rank}.err").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-STDERR_TAIL_LINES:])


def kill(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Kill every rank still running, by its PID and its process group (each rank leads its own session, so
    the group holds only what that rank started)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def launch(
    command: Sequence[str],
    *,
    name: str,
    run: str,
    root: Path,
    settings: Settings,
    env: dict[str, str] | None = None,
) -> Launch:
    """Start `command` once per rank with the job environment, wait (bounded), kill what is left."""
    where = root / name
    out = Launch(name=name, run=run, run_dir=where / "run", store_dir=where / "store", logs=where / "logs")
    out.logs.mkdir(parents=True, exist_ok=True)
    full = base_env()
    full.update(settings.job_env(run, out.run_dir))
    full.update(LONGRUN_STORE_DIR=str(out.store_dir), LONGRUN_FAULT_STATE_DIR=str(where / "fault-state"))
    full.update(env or {})
    port = str(free_port())
    procs: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    try:
        for rank in range(WORLD):
            rank_env = dict(full, RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK="0",
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port)  # fmt: skip
            with open(out.logs / f"r{rank}.out", "wb") as o, open(out.logs / f"r{rank}.err", "wb") as e:
                procs.append(
                    subprocess.Popen(
                        list(command),
                        env=rank_env,
                        stdin=subprocess.DEVNULL,
                        stdout=o,
                        stderr=e,
                        start_new_session=True,
                    )  # fmt: skip
                )
        deadline = started + settings.timeout_s
        failed_at: float | None = None
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if now >= deadline:
                out.timed_out = True
                break
            if failed_at is None and any(
                p.returncode not in (None, 0, schema.EXIT_SDC_VERDICT) for p in procs
            ):
                failed_at = now
            if failed_at is not None and now - failed_at > FAILED_RANK_GRACE_S:
                out.killed_after_failure = True
                break
            time.sleep(0.2)
        out.rcs = [p.poll() for p in procs]
    finally:
        kill(procs)
    out.wall_s = time.monotonic() - started
    return out


# ---- reading what a run wrote ------------------------------------------------------------------------


@dataclass(slots=True)
class Found:
    """The records of one kind in a run dir: the ones that read, and the ones that did not (path: why)."""

    records: list[Any] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)


def read_kind(run_dir: Path, kind: str, pattern: str, *, lines: bool = False) -> Found:
    found = Found()
    for path in sorted(run_dir.glob(pattern)):
        try:
            bodies = path.read_text().splitlines() if lines else [path.read_text()]
            for body in bodies:
                if body.strip():
                    found.records.append(load_record(kind, body))
        except (OSError, ValueError) as e:
            found.bad.append(f"{path.relative_to(run_dir)}: {e}")
    return found


def has_records(run_dir: Path) -> bool:
    names = ("segments", "progress", "checks", "checkpoints", "saves", "alerts", "faults", schema.REPORT_PATH)
    return any((run_dir / n).exists() for n in names)


@dataclass(slots=True)
class Row:
    run: str
    what: str
    status: str
    detail: str = ""


class Report:
    def __init__(self) -> None:
        self.rows: list[Row] = []

    def add(self, run: str, what: str, status: str, detail: str = "") -> None:
        self.rows.append(Row(run, what, status, detail))

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status != OK]

    def render(self) -> str:
        head = Row("run", "expectation", "result", "detail")
        rows = [head, *self.rows]
        w_run = max(len(r.run) for r in rows)
        w_what = max(len(r.what) for r in rows)
        w_status = max(len(r.status) for r in rows)
        out = []
        for r in rows:
            first, *more = (r.detail or "").splitlines() or [""]
            out.append(f"{r.run:<{w_run}}  {r.what:<{w_what}}  {r.status:<{w_status}}  {first}".rstrip())
            pad = " " * (w_run + w_what + w_status + 6)
            out.extend(f"{pad}{line}".rstrip() for line in more)
        return "\n".join(out)


def _bad(found: Found) -> str:
    return "unreadable: " + "; ".join(found.bad[:3])


def check_exit(rep: Report, launched: Launch, expected: int) -> bool:
    what = f"exit {expected} on every rank"
    if launched.rcs == [expected] * WORLD:
        rep.add(launched.name, what, OK, f"{launched.wall_s:.0f} s")
        return True
    if launched.timed_out:
        why = f"still running after --timeout-s {round(launched.wall_s)} s: killed"
    elif launched.killed_after_failure:
        why = f"a rank failed and the others were still running {FAILED_RANK_GRACE_S:.0f} s later: killed"
    else:
        why = ""
    codes = ", ".join(f"r{i}={'killed' if rc is None else rc}" for i, rc in enumerate(launched.rcs))
    detail = f"exit codes {codes}" + (f" ({why})" if why else "")
    worst = next((i for i, rc in enumerate(launched.rcs) if rc not in (None, expected)), None)
    if worst is None:
        worst = next((i for i, rc in enumerate(launched.rcs) if rc != expected), 0)
    tail = launched.stderr_tail(worst)
    if tail:
        detail += f"\nstderr of rank {worst} (last lines; all in {launched.logs}):\n" + tail
    rep.add(launched.name, what, WRONG, detail)
    return False


def check_segment(rep: Report, launched: Launch) -> list[Any]:
    found = read_kind(launched.run_dir, "segment", "segments/*.json")
    what = "segment record, first_healthy_step"
    if found.bad:
        rep.add(launched.name, what, WRONG, _bad(found))
    elif not found.records:
        rep.add(launched.name, what, MISSING, "no segments/*.json: rank 0 writes it in Guard.prepare()")
    elif all(s.first_healthy_step is None for s in found.records):
        rep.add(
            launched.name, what, MISSING, "the segment has no first_healthy_step: no step passed its checks"
        )
    else:
        seg = found.records[-1]
        rep.add(
            launched.name,
            what,
            OK,
            f"start_step {seg.start_step}, first healthy step {seg.first_healthy_step}",
        )
    return found.records


def check_progress(rep: Report, launched: Launch, steps: int) -> None:
    found = read_kind(launched.run_dir, "progress", schema.PROGRESS_PATH)
    what = f"progress record at step {steps}"
    if found.bad:
        rep.add(launched.name, what, WRONG, _bad(found))
    elif not found.records:
        rep.add(launched.name, what, MISSING, f"no {schema.PROGRESS_PATH}: the heartbeat the monitor reads")
    elif found.records[0].step != steps:
        rep.add(launched.name, what, WRONG, f"the last progress is step {found.records[0].step}, not {steps}")
    else:
        rep.add(launched.name, what, OK, f"loss {found.records[0].loss}")


def check_checks(rep: Report, launched: Launch) -> None:
    found = read_kind(launched.run_dir, "check", "checks/*.jsonl", lines=True)
    for check in schema.CHECKS:
        what = f"check records: {check} pass"
        mine = [r for r in found.records if r.check == check]
        if found.bad:
            rep.add(launched.name, what, WRONG, _bad(found))
            continue
        if not mine:
            rep.add(launched.name, what, MISSING, f"no check record for {check}: {CHECK_HINTS[check]}")
            continue
        failed = [r for r in mine if r.verdict != "pass"]
        ranks = {r.rank for r in mine}
        if failed:
            r = failed[0]
            rep.add(
                launched.name,
                what,
                WRONG,
                f"{len(failed)} not passed, first: step {r.step} rank {r.rank} {r.verdict}",
            )
        elif ranks != set(range(WORLD)):
            missing = sorted(set(range(WORLD)) - ranks)
            rep.add(
                launched.name, what, MISSING,
                f"none from rank(s) {missing}: every rank writes its own (a step counts as passed only when every rank recorded it)",
            )  # fmt: skip
        else:
            steps = sorted({r.step for r in mine})
            rep.add(
                launched.name, what, OK, f"{len(mine)} records, ranks 0-{WORLD - 1}, steps {_steps(steps)}"
            )


def _steps(steps: Sequence[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 4 else f"{steps[0]}..{steps[-1]}"


def check_checkpoints(rep: Report, launched: Launch, settings: Settings) -> bool:
    """Manifests and save records; True when the checkpoint run B needs is there."""
    manifests = read_kind(launched.run_dir, "manifest", "checkpoints/step-*/manifest.json")
    want = settings.resume_step
    what = f"checkpoint with manifest at step {want}"
    steps = sorted(m.step for m in manifests.records)
    usable = want in steps
    if manifests.bad:
        rep.add(launched.name, what, WRONG, _bad(manifests))
    elif not steps:
        rep.add(
            launched.name, what, MISSING,
            "no checkpoints/step-*/manifest.json: is LONGRUN_CHECKPOINT_EVERY read (GuardConfig.from_env), "
            "and the loop run through training.api?",
        )  # fmt: skip
    elif not usable:
        rep.add(launched.name, what, MISSING, f"checkpoints at steps {_steps(steps)}, none at {want}")
    else:
        rep.add(launched.name, what, OK, f"steps {_steps(steps)}")
    saves = read_kind(launched.run_dir, "save", "saves/*.json")
    what = "save record ok for each checkpoint"
    by_step = {s.step: s for s in saves.records}
    if saves.bad:
        rep.add(launched.name, what, WRONG, _bad(saves))
    elif not saves.records:
        rep.add(launched.name, what, MISSING, "no saves/*.json")
    elif not_ok := [s for s in saves.records if not s.ok]:
        rep.add(launched.name, what, WRONG, f"step {not_ok[0].step}: {not_ok[0].error}")
    elif missing := [s for s in steps if s not in by_step]:
        rep.add(launched.name, what, MISSING, f"no save record for step(s) {_steps(missing)}")
    else:
        rep.add(launched.name, what, OK, f"{len(saves.records)} saves")
    return usable and not manifests.bad


def check_report(rep: Report, launched: Launch, steps: int) -> Any:
    found = read_kind(launched.run_dir, "report", schema.REPORT_PATH)
    what = f"report: final_step {steps}, final_fingerprint"
    if found.bad:
        rep.add(launched.name, what, WRONG, _bad(found))
    elif not found.records:
        rep.add(
            launched.name, what, MISSING, f"no {schema.REPORT_PATH}: the guard writes it after the last step"
        )
    elif found.records[0].final_step != steps:
        rep.add(launched.name, what, WRONG, f"final_step {found.records[0].final_step}")
    else:
        rep.add(launched.name, what, OK, f"final_fingerprint {found.records[0].final_fingerprint}")
        return found.records[0]
    return None


def check_no_alert(rep: Report, launched: Launch) -> None:
    found = read_kind(launched.run_dir, "alert", "alerts/*.json")
    if found.bad or found.records:
        first = found.records[0] if found.records else None
        detail = (
            f"{first.check} at step {first.step}, suspects ranks {list(first.suspect_ranks)}"
            if first
            else _bad(found)
        )
        rep.add(launched.name, "no alert", WRONG, detail)
    else:
        rep.add(launched.name, "no alert", OK)


def check_in_store(rep: Report, launched: Launch, relatives: Sequence[str]) -> None:
    what = "records in the store"
    missing = [r for r in relatives if not (launched.store_dir / schema.store_key(launched.run, r)).is_file()]
    if missing:
        rep.add(
            launched.name, what, MISSING,
            f"not under LONGRUN_STORE_DIR/runs/{launched.run}/: {', '.join(missing)} (the orchestrator reads the "
            "store: keep GuardConfig.use_store on)",
        )  # fmt: skip
    else:
        rep.add(launched.name, what, OK, ", ".join(relatives))


def store_relatives(run_dir: Path, pattern: str) -> list[str]:
    return [str(p.relative_to(run_dir)) for p in sorted(run_dir.glob(pattern))]


# ---- the three runs ----------------------------------------------------------------------------------


def run_clean(
    rep: Report, command: Sequence[str], root: Path, settings: Settings
) -> tuple[Launch, bool, Any]:
    a = launch(command, name="A clean", run="conformance-a", root=root, settings=settings)
    check_exit(rep, a, 0)
    if not has_records(a.run_dir):
        rep.add(a.name, "longrun records", MISSING, NO_RECORDS)
        return a, False, None
    check_segment(rep, a)
    check_progress(rep, a, settings.steps)
    check_checks(rep, a)
    usable = check_checkpoints(rep, a, settings)
    report = check_report(rep, a, settings.steps)
    check_no_alert(rep, a)
    check_in_store(rep, a, [schema.REPORT_PATH, *store_relatives(a.run_dir, "segments/*.json")])
    return a, usable, report


def run_resume(
    rep: Report, command: Sequence[str], root: Path, settings: Settings, a: Launch, a_report: Any
) -> None:
    ref = a.run_dir / schema.checkpoint_dir(settings.resume_step)
    b = launch(command, name="B resume", run="conformance-b", root=root, settings=settings,
               env={"LONGRUN_RESUME_FROM": str(ref).rstrip("/")})  # fmt: skip
    check_exit(rep, b, 0)
    if not has_records(b.run_dir):
        rep.add(b.name, "longrun records", MISSING, NO_RECORDS)
        return
    segments = read_kind(b.run_dir, "segment", "segments/*.json")
    what = f"resumed at step {settings.resume_step} (segment start_step)"
    starts = sorted({s.start_step for s in segments.records})
    if segments.bad:
        rep.add(b.name, what, WRONG, _bad(segments))
    elif not segments.records:
        rep.add(b.name, what, MISSING, "no segments/*.json")
    elif settings.resume_step not in starts:
        rep.add(
            b.name, what, WRONG,
            f"started at step {', '.join(map(str, starts))}: LONGRUN_RESUME_FROM was not used (GuardConfig.from_env "
            "reads it; the guard resumes in prepare())",
        )  # fmt: skip
    else:
        rep.add(b.name, what, OK, f"from {ref.name}")
    found = read_kind(b.run_dir, "report", schema.REPORT_PATH)
    what = "final_fingerprint equals run A's"
    if found.bad:
        rep.add(b.name, what, WRONG, _bad(found))
    elif not found.records:
        rep.add(b.name, what, MISSING, f"no {schema.REPORT_PATH}")
    elif a_report is None:
        rep.add(b.name, what, MISSING, "run A wrote no usable report to compare with")
    elif found.records[0].final_step != settings.steps:
        rep.add(b.name, what, WRONG, f"final_step {found.records[0].final_step}, not {settings.steps}")
    elif found.records[0].final_fingerprint != a_report.final_fingerprint:
        rep.add(
            b.name, what, WRONG,
            f"{found.records[0].final_fingerprint} != {a_report.final_fingerprint}: the resume is not bit-identical; "
            "pass the data loader (state=), the scheduler and every other stateful object to guard.prepare()",
        )  # fmt: skip
    else:
        rep.add(b.name, what, OK, f"{a_report.final_fingerprint} (bit-identical)")
    check_no_alert(rep, b)


def run_drill(rep: Report, command: Sequence[str], root: Path, settings: Settings) -> None:
    drill = settings.drill
    c = launch(command, name="C drill", run="conformance-c", root=root, settings=settings,
               env={"LONGRUN_FAULTS": drill.spec})  # fmt: skip
    check_exit(rep, c, schema.EXIT_SDC_VERDICT)
    if not has_records(c.run_dir):
        rep.add(c.name, "longrun records", MISSING, NO_RECORDS)
        return
    faults = read_kind(c.run_dir, "fault", "faults/*.json")
    what = f"fault record ({drill.spec} fired)"
    fired = [f for f in faults.records if f.fault == drill.kind]
    if faults.bad:
        rep.add(c.name, what, WRONG, _bad(faults))
    elif not fired:
        rep.add(
            c.name,
            what,
            MISSING,
            "the drill never fired: does the entrypoint leave Guard(faults=None), which reads LONGRUN_FAULTS?",
        )
    else:
        rep.add(c.name, what, OK, f"step {fired[0].step}, rank {fired[0].rank} on {fired[0].node}")
    alerts = read_kind(c.run_dir, "alert", "alerts/*.json")
    what = f"one alert: {drill.check}, rank {drill.rank} / node {drill.node}"
    if alerts.bad:
        rep.add(c.name, what, WRONG, _bad(alerts))
    elif not alerts.records:
        rep.add(c.name, what, MISSING, "no alerts/*.json: the verdict was never written")
    elif len(alerts.records) != 1:
        rep.add(
            c.name,
            what,
            WRONG,
            f"{len(alerts.records)} alerts: {[(x.check, x.step) for x in alerts.records]}",
        )
    else:
        alert = alerts.records[0]
        got = (alert.check, list(alert.suspect_ranks), list(alert.suspect_nodes))
        if got != (drill.check, [drill.rank], [drill.node]):
            rep.add(
                c.name,
                what,
                WRONG,
                f"{alert.check} at step {alert.step} naming ranks {got[1]}, nodes {got[2]}",
            )
        else:
            rep.add(c.name, what, OK, f"step {alert.step}")
        check_in_store(rep, c, store_relatives(c.run_dir, "alerts/*.json"))


def conformance(command: Sequence[str], root: Path, settings: Settings) -> Report:
    rep = Report()
    say(f"run A (clean, {settings.steps} steps) ...")
    a, usable, a_report = run_clean(rep, command, root, settings)
    if not has_records(a.run_dir):
        rep.add("B resume", "run", MISSING, "not run: run A wrote no records")
        rep.add("C drill", "run", MISSING, "not run: run A wrote no records")
        return rep
    if usable:
        say(f"run B (resume from step {settings.resume_step}) ...")
        run_resume(rep, command, root, settings, a, a_report)
    else:
        rep.add(
            "B resume", "run", MISSING, f"not run: run A left no checkpoint at step {settings.resume_step}"
        )
    say(f"run C (drill {settings.drill.spec}) ...")
    run_drill(rep, command, root, settings)
    return rep


def say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


# ---- the command -------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["check"]:  # `longrun entrypoint check ...` hands over everything after `entrypoint`
        args = args[1:]
    parser = build_parser()
    if "--" not in args:
        if any(a in ("-h", "--help") for a in args):
            parser.print_help()
            return 0
        parser.print_usage(sys.stderr)
        print(f"{PROG}: give the command of one rank after `--`, e.g. -- python -m my.train", file=sys.stderr)
        return 2
    cut = args.index("--")
    options, command = args[:cut], args[cut + 1 :]
    try:
        ns = parser.parse_args(options)
    except SystemExit as e:
        return int(e.code or 0)
    if not command:
        print(f"{PROG}: no command after `--`", file=sys.stderr)
        return 2
    try:
        settings = settings_from(ns)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    if ns.keep is not None:
        root = ns.keep.resolve()
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            print(f"{PROG}: --keep {ns.keep}: not a new or empty directory", file=sys.stderr)
            return 2
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="longrun-conformance-"))
    say(
        f"{' '.join(command)} on {WORLD} CPU ranks ({', '.join(NODES)}); each run within {settings.timeout_s:.0f} s"
    )
    try:
        rep = conformance(command, root, settings)
    except OSError as e:  # the command cannot be started at all
        print(f"{PROG}: cannot start {command[0]!r}: {e}", file=sys.stderr)
        return 2
    finally:
        if ns.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(rep.render())
    failed = rep.failed
    if failed:
        print(f"FAIL: {len(failed)} of {len(rep.rows)} expectations do not hold")
    else:
        print(f"PASS: all {len(rep.rows)} expectations hold: the entrypoint is ready for training_run")
    if ns.keep is not None:
        print(f"run dirs, stores and rank logs kept in {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
