"""Detection quality, measured: a fault campaign over the guard's three checks, and clean runs for false alarms.

    python bench/bench_campaign.py [--trials 300] [--clean 20] [--ranks 4] [--cadence 10] [--seed 1]

Starts `--ranks` gloo ranks on this host (one process each, each rank its own node name). Each trial is a
fresh `training.api.Guard` over the tiny reference model with every check on at `--cadence` (recompute and
vote every `cadence` steps; the finite check every step), and at most one fault, drawn at random from the
trial's seed (every rank draws the same):

    grad-bit     one bit (0-31) of one element of one parameter's local gradient, on one rank
    grad-scale   that element times (1 + d), d log-uniform in [1e-8, 1]
    nan / inf    that element NaN or +Inf (about 2% of the faults: published gate-level injections find about
                 1% of GPU SDCs surface as NaN/Inf)
    weight-bit   one bit of one element of one parameter, after the update (a flip in memory)
    compute      every output of one matmul layer times (1 + e), e log-uniform in [1e-7, 1e-2] (a sick unit;
                 always persistent)

Gradient faults are one-off (the step's real backward pass only) or persistent (every backward pass on that
rank from the step on, recomputes included: a sick unit computes them all); a persistent weight fault is a
stuck-at-1 bit (set again after every update). The step is uniform in [1, 2 * cadence], the rank, the
tensor and the element uniform. Faults are injected through the user's side of the API only (tensor hooks
on the parameters, a forward hook, the parameters between steps): nothing of longrun's is patched.

A trial runs until a check's verdict, or `cadence + 2` steps past the fault (every check has had its turn).
For each fault it records whether it changed any bit at all, which check caught it, after how many steps,
and whether it named the faulty rank, named nobody (a verdict without a suspect: nothing is drained), or
named another rank (the one outcome that would drain a healthy node; the bench fails on it). A miss gets its reason: the fault changed no bit (below
float32's resolution, or a stuck bit already set), or a one-off gradient fault between audits (averaged
into every replica before any check could compare it: docs/checks.md "Blind spots"), or, if neither,
"unexplained" (which would be a bug). Clean trials (no fault) count false alarms per clean rank-hour.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: (kind, persistent) -> share of the faults (before the NaN/Inf minority).
MIX: dict[tuple[str, bool], float] = {
    ("grad-bit", False): 0.22,
    ("grad-bit", True): 0.14,
    ("grad-scale", False): 0.12,
    ("grad-scale", True): 0.10,
    ("weight-bit", False): 0.20,
    ("weight-bit", True): 0.10,
    ("compute", True): 0.10,
}
NONFINITE_SHARE = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class Draw:
    """One trial's fault (kind None: a clean trial)."""

    trial: int
    kind: str | None
    persistent: bool = False
    step: int = 0
    rank: int = 0
    tensor: int = 0
    """Index into the model's trainable parameters (compute: into its matmul layers)."""
    index: int = 0
    """Flat element index (taken modulo the tensor's size)."""
    bit: int = 0
    factor: float = 1.0
    """grad-scale: 1 + d; compute: 1 + e."""


def draw(trial: int, *, seed: int, world: int, cadence: int, clean: bool) -> Draw:
    """The fault of `trial`: a pure function of its arguments, so every rank draws the same."""
    if clean:
        return Draw(trial=trial, kind=None)
    rng = random.Random(seed * 1_000_003 + trial)
    if rng.random() < NONFINITE_SHARE:
        kind, persistent = rng.choice(("nan", "inf")), False
    else:
        kind, persistent = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    factor = 1.0
    if kind == "grad-scale":
        factor = 1.0 + 10 ** rng.uniform(-8, 0)
    elif kind == "compute":
        factor = 1.0 + 10 ** rng.uniform(-7, -2)
    return Draw(
        trial=trial, kind=kind, persistent=persistent, step=rng.randint(1, 2 * cadence),
        rank=rng.randrange(world), tensor=rng.randrange(1 << 30), index=rng.randrange(1 << 30),
        bit=rng.randrange(32), factor=factor,
    )  # fmt: skip


class Fault:
    """One rank's side of a drawn fault: hooks on the user's model, and the weights between steps."""

    def __init__(self, d: Draw, *, rank: int, model: Any) -> None:
        import torch

        self.d, self.torch = d, torch
        self.mine = d.kind is not None and d.rank == rank
        self.step = 0
        self.passes = 0
        self.changed: bool | None = None
        """Whether any firing of the fault changed a bit (None: it never fired here). A stuck bit already
        set changes nothing when it fires, but may after an update cleared it."""
        self.handles: list[Any] = []
        params = [p for p in model.parameters() if p.requires_grad]
        if not self.mine:
            return
        if d.kind == "compute":
            from training.faults import is_matmul_layer

            layers = [m for m in model.modules() if is_matmul_layer(m)]
            self.handles.append(layers[d.tensor % len(layers)].register_forward_hook(self._forward))
        elif d.kind in ("grad-bit", "grad-scale", "nan", "inf"):
            self.handles.append(params[d.tensor % len(params)].register_hook(self._gradient))
        self.param = params[d.tensor % len(params)]

    def _active(self) -> bool:
        if self.d.persistent:
            return self.step >= self.d.step
        return self.step == self.d.step and self.passes == 1  # the real pass of its step only

    def loss_fn(self, inner: Any) -> Any:
        def counted(model: Any, batch: Any) -> Any:
            self.passes += 1
            return inner(model, batch)

        return counted

    def begin(self, step: int) -> None:
        self.step, self.passes = step, 0

    def _note(self, changed: bool) -> None:
        self.changed = bool(self.changed) or changed

    def _gradient(self, grad: Any) -> Any:
        if not self._active():
            return None
        g = grad.detach().clone()
        flat = g.view(-1)
        i = self.d.index % flat.numel()
        before = flat[i : i + 1].clone()
        if self.d.kind == "grad-bit":
            words = flat.view(self.torch.int32)
            words[i : i + 1] ^= self._mask()
        elif self.d.kind == "grad-scale":
            flat[i] = flat[i] * self.d.factor
        else:
            flat[i] = math.nan if self.d.kind == "nan" else math.inf
        self._note(
            not bool(self.torch.equal(before.view(self.torch.int32), flat[i : i + 1].view(self.torch.int32)))
        )
        return g

    def _mask(self) -> Any:
        """The drawn bit as an int32 mask (bit 31 is the sign bit: it wraps to -2**31)."""
        torch = self.torch
        return torch.tensor([1 << self.d.bit], dtype=torch.int64).to(torch.int32)

    def _forward(self, module: Any, inputs: Any, output: Any) -> Any:
        if not self._active():
            return None
        scaled = output * self.d.factor
        self._note(not bool(self.torch.equal(output.detach(), scaled.detach())))
        return scaled

    def after_step(self, step: int) -> None:
        """Weight faults land after the step's update and vote: the next vote is the first that can see them."""
        if not self.mine or self.d.kind != "weight-bit" or step < self.d.step:
            return
        if not self.d.persistent and step != self.d.step:
            return
        torch = self.torch
        with torch.no_grad():
            words = self.param.data.view(-1).view(torch.int32)
            i = self.d.index % words.numel()
            before = words[i : i + 1].clone()
            mask = self._mask()
            words[i : i + 1] = (words[i : i + 1] | mask) if self.d.persistent else (words[i : i + 1] ^ mask)
            self._note(not bool(torch.equal(before, words[i : i + 1])))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from training.api.guard import Guard
    from training.config import CheckConfig, TrainConfig, model_preset
    from training.data import SyntheticBatches
    from training.dist import init_process_group, placement_from_env
    from training.model import build_model, lm_loss

    logging_quiet()
    place = placement_from_env()
    init_process_group(place, timeout_s=600)
    rows: list[dict[str, Any]] = []
    total = args.trials + args.clean
    for trial in range(total):
        d = draw(
            trial, seed=args.seed, world=place.world_size, cadence=args.cadence, clean=trial >= args.trials
        )
        last = (d.step if d.kind else 2 * args.cadence) + args.cadence + 2
        cfg = TrainConfig(
            run=f"campaign-{trial}", run_dir=Path(args.run_dir, f"t{trial}"), steps=last,
            model=model_preset("tiny"), use_store=False,
            checks=CheckConfig(recompute_every=args.cadence, vote_every=args.cadence),
        )  # fmt: skip
        guard = Guard(cfg, faults=())
        model = build_model(cfg.model, seed=cfg.seed, device=guard.device)
        fault = Fault(d, rank=guard.rank, model=model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, foreach=False)
        guard.prepare(model, optimizer, loss_fn=fault.loss_fn(lm_loss))
        data = SyntheticBatches(cfg.model, seed=cfg.seed, rank=guard.rank)
        caught: dict[str, Any] | None = None
        t0 = time.perf_counter()
        while not guard.done:
            step = guard.next_step
            fault.begin(step)
            out = guard.step(next(data))
            fault.after_step(step)
            if out.failed is not None:
                caught = {"check": out.failed.check, "step": step, "ranks": out.failed.suspect_ranks}
        wall = time.perf_counter() - t0
        guard.close()
        fault.remove()
        changed: list[object] = [None] * place.world_size
        dist.all_gather_object(changed, fault.changed)
        if place.rank == 0:
            rows.append(
                outcome(d, caught, changed[d.rank] if d.kind else None, args.cadence, wall, place.world_size)
            )
            if args.verbose:
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if place.rank == 0:
        Path(args.out).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def logging_quiet() -> None:
    import logging

    logging.basicConfig(level=logging.ERROR)
    for name in ("training", "training.api", "training.verdict"):
        logging.getLogger(name).setLevel(logging.ERROR)


def outcome(
    d: Draw, caught: dict[str, Any] | None, changed: object, cadence: int, wall: float, world: int
) -> dict[str, Any]:
    """One trial's row: the draw, what caught it and when, and why a miss was missed."""
    row: dict[str, Any] = {**asdict(d), "changed": changed, "wall_s": round(wall, 3), "world": world}
    row["detected"] = caught is not None
    if caught is not None:
        row.update(check=caught["check"], detect_step=caught["step"], named=caught["ranks"])
        row["latency"] = caught["step"] - d.step if d.kind else None
        row["named_right"] = caught["ranks"] == [d.rank] if d.kind else None
        return row
    if d.kind is None:
        return row
    if changed is False:
        row["why_missed"] = "no bit changed (below float32 resolution, or the stuck bit was already set)"
    elif changed is None:
        row["why_missed"] = "the fault never fired (its layer or tensor was not used at its step)"
    elif d.kind in ("grad-bit", "grad-scale") and not d.persistent and d.step % cadence != 0:
        row["why_missed"] = "one-off gradient fault between audits: averaged into every replica"
    else:
        row["why_missed"] = "unexplained"
    return row


def report(rows: list[dict[str, Any]], *, command: str, cadence: int) -> int:
    faults = [r for r in rows if r["kind"] is not None]
    clean = [r for r in rows if r["kind"] is None]
    print(f"command: {command}")
    print(
        f"{len(faults)} faulty trials, {len(clean)} clean trials; checks at cadence {cadence} (finite every step)"
    )
    print(f"{'fault':<22} {'n':>4} {'changed':>8} {'caught':>7} {'recall':>8} {'of changed':>11} "
          f"{'named right':>12} {'unnamed':>8} {'WRONG':>6} {'latency med/max':>16}")  # fmt: skip
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in faults:
        groups[f"{r['kind']} {'persistent' if r['persistent'] else 'one-off'}"].append(r)
    for name in sorted(groups):
        rs = groups[name]
        changed = [r for r in rs if r["changed"]]
        caught = [r for r in rs if r["detected"]]
        caught_changed = [r for r in changed if r["detected"]]
        lat = [r["latency"] for r in caught]
        print(
            f"{name:<22} {len(rs):>4} {len(changed):>8} {len(caught):>7} {_pct(len(caught), len(rs)):>8} "
            f"{_pct(len(caught_changed), len(changed)):>11} {_pct(sum(1 for r in caught if r['named_right']), len(caught)):>12} "
            f"{sum(1 for r in caught if not r['named']):>8} {sum(1 for r in caught if r['named'] and not r['named_right']):>6} "
            f"{(f'{statistics.median(lat):g}/{max(lat)}' if lat else '-'):>16}"
        )
    by_check = Counter(r["check"] for r in faults if r["detected"])
    print("caught by: " + ", ".join(f"{c} {n}" for c, n in sorted(by_check.items())))
    persistent = [r for r in faults if r["persistent"] and r["changed"]]
    p_caught = sum(1 for r in persistent if r["detected"])
    print(f"persistent faults that changed a bit: {p_caught}/{len(persistent)} caught "
          f"({_pct(p_caught, len(persistent))}; goal >= 99%)")  # fmt: skip
    all_changed = [r for r in faults if r["changed"]]
    print(f"all faults that changed a bit: {sum(1 for r in all_changed if r['detected'])}/{len(all_changed)} caught "
          f"({_pct(sum(1 for r in all_changed if r['detected']), len(all_changed))})")  # fmt: skip
    misses = Counter(r["why_missed"] for r in faults if not r["detected"])
    for why, n in misses.most_common():
        print(f"missed {n}: {why}")
    rank_hours = sum(r["wall_s"] * r["world"] for r in clean) / 3600
    alarms = sum(1 for r in clean if r["detected"])
    rate = alarms / rank_hours if rank_hours else math.nan
    print(f"clean trials: {alarms} false alarm(s) in {len(clean)} runs, {rank_hours:.3f} rank-hours "
          f"({rate:.1f} per clean rank-hour)")  # fmt: skip
    wrong = [r["trial"] for r in faults if r["detected"] and r["named"] and not r["named_right"]]
    print(f"named a rank that was not the faulty one: {len(wrong)} {wrong if wrong else ''}".rstrip())
    unexplained = misses.get("unexplained", 0)
    return 1 if unexplained or alarms or wrong else 0


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:.1f}%" if d else "-"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=300, help="faulty trials")
    p.add_argument("--clean", type=int, default=20, help="clean trials (false alarms)")
    p.add_argument("--ranks", type=int, default=4, help="gloo ranks, one node name each (>= 3 to name one)")
    p.add_argument("--cadence", type=int, default=10, help="recompute and vote cadence (the default: 10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--verbose", action="store_true", help="print each trial's row as it ends")
    p.add_argument("--json", help="also write every trial's row here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    command = " ".join(["python", "bench/bench_campaign.py", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="bench-campaign-") as tmp:
        out = Path(tmp) / "rows.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LONGRUN_FAULT"))}
        env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   WORLD_SIZE=str(args.ranks), LONGRUN_NODE_NAMES=",".join(f"n{i + 1}" for i in range(args.ranks)))  # fmt: skip
        wargs = [sys.executable, str(Path(__file__).resolve()), "--worker", "--run-dir", tmp, "--out", str(out),
                 "--trials", str(args.trials), "--clean", str(args.clean), "--cadence", str(args.cadence),
                 "--seed", str(args.seed)] + (["--verbose"] if args.verbose else [])  # fmt: skip
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still reaches the finally below
        procs = [
            subprocess.Popen(
                wargs,
                cwd=REPO,
                env=dict(env, RANK=str(r), LOCAL_RANK="0"),
                stderr=None if r == 0 else subprocess.DEVNULL,
            )  # fmt: skip
            for r in range(args.ranks)
        ]
        try:
            rcs = [proc.wait(timeout=4 * 3600) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
        if any(rcs) or not out.exists():
            print(f"campaign workers failed: exit codes {rcs}", file=sys.stderr)
            return 1
        rows = json.loads(out.read_text())
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return report(rows, command=command, cadence=args.cadence)


if __name__ == "__main__":
    sys.exit(main())
