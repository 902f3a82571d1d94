"""How longrun's store records and their readers grow with ranks and with the age of a run (issue 31 item 2),
driven by the real writers and readers against a local store, without training.

    python bench/bench_growth.py [--ranks 8,64,256] [--days 1,2,4] [--steps-per-day 120]

The writers are the job side's own: one `EventWriter` + `RunRecords` per rank (check records, batched
every `store_flush_every` steps), rank 0's progress heartbeat and segment record, and the
`CheckpointSaver` (writer thread, tiny tensors) for checkpoints; the orchestrator's `validate` and
`promote` record each checkpoint the way the checkpoint gate does. They write into a `LocalDirStore`
wrapped in `CountingStore`, which delegates every call and counts it by kind (put/get/list/head/delete)
and by record prefix (the key component after `runs/<run>/`). After day 1, 2, 4 ... the real readers run
directly (no Airflow): the pre-incident pick (`plan_pick`, the read part of `pick_pre_incident`), the
audit's reads (`build_table` + `rehash_sample`; the Great Expectations pass reads nothing from the store
and is skipped) uncached, as a first audit reads, and `audit/d`, the daily audit through its record cache
(run at the end of every simulated day, so each reads one day's records), and the run-health page's
loader (`load_run_health`).

Scaling, explicit: a simulated day has `--steps-per-day` steps (default 120), not the 86,400 of a real day
at the assumed 1 s/step. Step-driven cadences are the real defaults (training.config: checks flushed every
20 steps; recompute audit and weight vote every 10; finite check every step), so every step-driven count
is multiplied by 86,400 / steps-per-day to give a real run-day; check batches (one per rank every 20 steps,
plus one per rank at each checkpoint, which flushes them) by (86,400/20 + 24) / (steps-per-day/20 +
checkpoints-per-day). Keep steps-per-day / checkpoints-per-day a multiple of 20. The heartbeat goes to the store every 5
steps (progress_interval_s = 5 s at 1 s/step). Checkpoints are time-driven: one an hour in a real run (24
a day), simulated as `--checkpoints-per-day` (default 2), so checkpoint counts scale by 24 / that. One
segment (incarnation) a day. The growth law of each kind and reader is the log-log slope over the ranks
and over the days measured; 30 days and 1,024-16,384 ranks are extrapolations by those slopes.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO, REPO / "plugins"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402  (tiny tensors for the checkpoint payload; nothing is trained)

from training.api.records import RunRecords  # noqa: E402
from training.checkpoint.saver import CheckpointSaver  # noqa: E402
from training.checkpoint.settings import SaverSettings  # noqa: E402
from training.checks.base import CheckResult  # noqa: E402
from training.config import CheckConfig, GuardConfig  # noqa: E402
from training.events import EventWriter  # noqa: E402
from training.fingerprint.host import combine, fingerprint_state  # noqa: E402
from training.records import schema  # noqa: E402
from training.segment import Segment  # noqa: E402
from training.store.interface import ObjectInfo, ObjectStore  # noqa: E402
from training.store.local import LocalDirStore  # noqa: E402

REAL_STEPS_PER_DAY = 86_400  # 1 s/step, assumed
REAL_CHECKPOINTS_PER_DAY = 24  # one an hour, assumed
PROGRESS_EVERY = 5  # steps between heartbeats in the store: progress_interval_s (5 s) at 1 s/step
OPS = ("put", "get", "list", "head", "delete")
LIST_PAGE = 1000  # S3 ListObjectsV2 returns at most this many keys a request


def prefix_of(key: str) -> str:
    """The record kind a key belongs to: the component after `runs/<run>/` (`progress`, `checks`, ...),
    the top component for keys outside `runs/`."""
    parts = key.split("/")
    if parts[0] == "runs" and len(parts) > 2:
        return parts[2].removesuffix(".json")
    return parts[0]


@dataclass
class Counts:
    """Requests by (op, prefix), bytes moved by (op, prefix), keys returned by listings and the listing
    pages S3 would bill (one per call, one per further 1,000 keys), by prefix."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    nbytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    listed: Counter[str] = field(default_factory=Counter)
    pages: Counter[str] = field(default_factory=Counter)

    def total(self, op: str | None = None) -> int:
        return sum(n for (o, _p), n in self.requests.items() if op is None or o == op)

    def billed(self, prefix: str | None = None) -> int:
        """Read requests as S3 bills them: gets and heads, and list pages rather than list calls."""
        one = sum(n for (o, p), n in self.requests.items() if o in ("get", "head") and prefix in (None, p))
        return one + sum(n for p, n in self.pages.items() if prefix in (None, p))

    def bytes_read(self) -> int:
        return sum(n for (o, _p), n in self.nbytes.items() if o == "get")

    def list_pages(self) -> int:
        return sum(self.pages.values())


class CountingStore:
    """An `ObjectStore` that delegates every call to `inner` and counts it into `counts` (swap `counts`
    to measure one phase). It is deliberately not rebuildable in another process (no store spec), so the
    checkpoint saver uploads in its writer thread, through this store, and every request is counted."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.counts = Counts()

    def _count(self, op: str, key: str, nbytes: int = 0) -> None:
        p = prefix_of(key)
        self.counts.requests[(op, p)] += 1
        self.counts.nbytes[(op, p)] += nbytes

    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> ObjectInfo:
        self._count("put", key, len(data))
        return self.inner.put_bytes(key, data, if_none_match=if_none_match, if_match=if_match)

    def put_file(self, key: str, path: str | os.PathLike[str], *, sha256: str | None = None) -> ObjectInfo:
        self._count("put", key, os.path.getsize(path))
        return self.inner.put_file(key, path, sha256=sha256)

    def get_bytes(self, key: str) -> bytes:
        try:
            data = self.inner.get_bytes(key)
        except Exception:
            self._count("get", key)
            raise
        self._count("get", key, len(data))
        return data

    def download(self, key: str, path: str | os.PathLike[str]) -> None:
        try:
            self.inner.download(key, path)
        except Exception:
            self._count("get", key)
            raise
        self._count("get", key, os.path.getsize(path))

    def head(self, key: str) -> ObjectInfo | None:
        self._count("head", key)
        return self.inner.head(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._count("list", prefix)
        n = 0
        try:
            for info in self.inner.list(prefix):
                n += 1
                self.counts.listed[prefix_of(prefix)] += 1
                yield info
        finally:
            self.counts.pages[prefix_of(prefix)] += max(1, math.ceil(n / LIST_PAGE))

    def list_dirs(self, prefix: str) -> Iterator[str]:
        self._count("list", prefix)
        n = 0
        try:
            for d in self.inner.list_dirs(prefix):
                n += 1
                yield d
        finally:
            self.counts.pages[prefix_of(prefix)] += max(1, math.ceil(n / LIST_PAGE))

    def delete(self, key: str) -> None:
        self._count("delete", key)
        self.inner.delete(key)

    def describe(self) -> str:
        return f"counting {self.inner.describe()}"


# ---- the run's writers ----------------------------------------------------------------------------


@dataclass
class SimRun:
    """One run's writers over `store`: a RunRecords per rank, rank 0's saver, and the orchestrator's gate."""

    store: CountingStore
    run_dir: Path
    ranks: int
    steps_per_day: int
    checkpoints_per_day: int
    run: str = "growth"
    step: int = 0
    day: int = 0
    records: list[RunRecords] = field(default_factory=list)

    def new_segment(self) -> None:
        """A new incarnation (one a day): every rank's writers are (re)made, rank 0 writes the segment."""
        for r in self.records:
            r.events.close()
        seg = Segment(
            run=self.run, segment_id=f"{1000 + self.day}.0-r0", job_id=str(1000 + self.day),
            restart_count=0, start_step=self.step, resumed_from=None, started_at=time.time(),
            world_size=self.ranks, nodes=tuple(f"n{r // 8:04d}" for r in range(self.ranks)),
        )  # fmt: skip
        self.records = [
            RunRecords(
                run=self.run,
                rank=rank,
                world=self.ranks,
                node=seg.nodes[rank],
                nodes=list(seg.nodes),
                events=EventWriter(
                    run=self.run,
                    run_dir=self.run_dir / f"r{rank}",
                    store=self.store,
                    rank=rank,
                    flush_every=flush_every(),
                    progress_interval_s=0.0,
                ),
                segment=seg,
            )  # fmt: skip
            for rank in range(self.ranks)
        ]
        self.records[0].write_segment(first_step=self.step + 1)

    def results(self, step: int, cfg: CheckConfig) -> list[CheckResult]:
        """The default checks' results at `step`: finite every step, recompute and the vote at cadence."""
        due = [
            ("finite", True),
            ("recompute", cfg.recompute_every and step % cfg.recompute_every == 0),
            ("weight_vote", cfg.vote_every and step % cfg.vote_every == 0),
        ]
        return [CheckResult(check=c, step=step, verdict="pass", duration_s=0.001) for c, on in due if on]

    def manifest_fields(
        self, state: dict[str, torch.Tensor], loss: float, nodes: tuple[str, ...]
    ) -> dict[str, Any]:
        """The caller fields `training.api.saves` gives the saver: the weights' fingerprints, the vote
        (one 64-bit vote per rank), the coverage, and the world (one node name per rank)."""
        fps = fingerprint_state(state)
        vote = combine(fps)
        return {
            "fingerprints": fps, "fingerprint": vote,
            "weight_vote": {
                "step": self.step, "verdict": "pass", "ranks": self.ranks,
                "votes": [vote] * self.ranks, "algorithm": "xxh3-64",
            },
            "coverage": dict.fromkeys(schema.CHECKS, self.step), "loss": loss,
            "world": {"nodes": sorted(set(nodes)), "ranks": list(nodes), "world_size": self.ranks},
            "code_version": "bench",
        }  # fmt: skip

    def one_day(self, saver: CheckpointSaver) -> None:
        """Write one simulated day: every step's check records on every rank, the heartbeat, checkpoints
        (saved, validated and promoted), then the incarnation's end."""
        from longrun.checkpoints.promote import promote
        from longrun.checkpoints.validate import validate

        self.day += 1
        self.new_segment()
        cfg = CheckConfig()
        ckpt_every = max(1, self.steps_per_day // self.checkpoints_per_day)
        for _ in range(self.steps_per_day):
            self.step += 1
            loss = 2.0 + 1.0 / self.step
            for rec in self.records:
                rec.checks(self.results(self.step, cfg), loss)
                rec.last_step = self.step
            if self.step % PROGRESS_EVERY == 0:
                self.records[0].events.progress(
                    schema.record(
                        "progress",
                        run=self.run,
                        step=self.step,
                        loss=loss,
                        step_time_s=1.0,
                        time=time.time(),
                        world_size=self.ranks,
                    )  # fmt: skip
                )
            if self.step % ckpt_every == 0:
                for rec in self.records:  # checkpoints flush the check batches (training.api.guard)
                    rec.events.flush()
                state = {"w": torch.zeros(4)}
                saver.save(
                    step=self.step, model_state=state,
                    manifest_fields=self.manifest_fields(state, loss, self.records[0].segment.nodes),
                )  # fmt: skip
                saver.wait()
                validate(self.store, self.run, self.step)
                promote(self.store, self.run, self.step)
        for rec in self.records:
            rec.end_segment("error")  # the incarnation ends: a daily failure
            rec.events.close()
        self.records = []


# ---- the readers ------------------------------------------------------------------------------------


def read_pick(store: ObjectStore, run: str, step: int) -> None:
    from longrun.checkpoints.pick import plan_pick

    plan_pick(store, run, {"check": "finite", "step": step, "suspect_nodes": ["n0000"]})


def read_audit(store: ObjectStore, run: str, step: int) -> None:
    from longrun.audit.rehash import rehash_sample
    from longrun.audit.table import build_table

    table = build_table(store, (run,))
    rehash_sample(store, table, sample_size=16, seed=0)


def read_daily_audit(store: ObjectStore, run: str, step: int) -> None:
    """The audit as `run_audit` runs it every day: through its record cache (longrun.audit.reader), so it
    reads what is new or changed since the day before. `measure` runs it at the end of every day."""
    from longrun.audit.rehash import rehash_sample
    from longrun.audit.table import build_table

    table = build_table(store, (run,), cache=True)
    rehash_sample(store, table, sample_size=16, seed=0)


def read_ui(store: ObjectStore, run: str, step: int) -> None:
    from longrun.ui.data import load_run_health

    load_run_health(store, run, now=time.time())


READERS: dict[str, Callable[[ObjectStore, str, int], None]] = {
    "pick": read_pick,
    "audit": read_audit,
    "audit/d": read_daily_audit,
    "ui page": read_ui,
}
#: Readers that run at the end of every simulated day, not only on the days sampled (what they read
#: depends on what they read the day before).
DAILY = {"audit/d"}


# ---- measurement ------------------------------------------------------------------------------------


@dataclass
class Sample:
    ranks: int
    day: int
    objects: Counter[str]  # prefix -> objects stored
    stored: Counter[str]  # prefix -> bytes stored
    writes: Counter[str]  # prefix -> write requests (puts) so far
    reads: dict[str, Counts]  # reader -> its counts


def stored_by_prefix(store: LocalDirStore) -> tuple[Counter[str], Counter[str]]:
    objects: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    for info in store.list("runs/"):
        objects[prefix_of(info.key)] += 1
        nbytes[prefix_of(info.key)] += info.size
    return objects, nbytes


def measure(
    ranks: int, days: list[int], steps_per_day: int, checkpoints_per_day: int, root: Path
) -> list[Sample]:
    """Run one simulated run of `ranks` ranks for max(days) days; after each day in `days`, sample the
    store and run every reader on it."""
    inner = LocalDirStore(root / "store")
    store = CountingStore(inner)
    sim = SimRun(
        store=store, run_dir=root / "run", ranks=ranks, steps_per_day=steps_per_day,
        checkpoints_per_day=checkpoints_per_day,
    )  # fmt: skip
    writes = store.counts
    out: list[Sample] = []
    saver = CheckpointSaver(
        run=sim.run, run_dir=root / "ckpt", store=store, settings=SaverSettings(writer="thread")
    )
    try:
        for day in range(1, max(days) + 1):
            store.counts = writes
            sim.one_day(saver)
            reads = {}
            for name in DAILY:
                store.counts = Counts()
                READERS[name](store, sim.run, sim.step)
                reads[name] = store.counts
            if day not in days:
                continue
            for name, reader in READERS.items():
                if name in DAILY:
                    continue
                store.counts = Counts()
                reader(store, sim.run, sim.step)
                reads[name] = store.counts
            objects, stored = stored_by_prefix(inner)
            puts = Counter({p: n for (op, p), n in writes.requests.items() if op == "put"})
            out.append(Sample(ranks, day, objects, stored, puts, reads))
    finally:
        saver.close()
    return out


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) on log(x); 0 when y is 0 throughout."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if y > 0]
    if len(pts) < 2:
        return 0.0
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else 0.0


def law(a_ranks: float, b_days: float) -> str:
    """The growth law from the exponents in ranks and in days (rounded to the nearest 0 or 1)."""
    r, d = round(a_ranks) >= 1, round(b_days) >= 1
    return {(False, False): "constant", (False, True): "steps", (True, False): "ranks"}.get(
        (r, d), "ranks x steps"
    )


def flush_every() -> int:
    """The default check-batch cadence (training.config GuardConfig.store_flush_every)."""
    return GuardConfig(run="growth", run_dir=Path("."), steps=1).store_flush_every


def scale_of(prefix: str, steps_per_day: int, checkpoints_per_day: int) -> float:
    """Real events a day per simulated event a day, for the record kind under `prefix` ("": a listing of
    the whole run, whose keys are mostly check batches)."""
    if prefix in ("checks", ""):  # a batch per rank every flush_every steps, and one more at each checkpoint
        flush = flush_every()
        real = REAL_STEPS_PER_DAY / flush + REAL_CHECKPOINTS_PER_DAY
        return real / (steps_per_day / flush + checkpoints_per_day)
    if prefix == "progress":
        return REAL_STEPS_PER_DAY / steps_per_day
    if prefix in ("checkpoints", "validations", "promoted", "saves"):
        return REAL_CHECKPOINTS_PER_DAY / checkpoints_per_day
    return 1.0  # segments: one a day, real and simulated


@dataclass(frozen=True)
class Grid:
    """The samples of one bench run, indexed by (ranks, day), with the extrapolation target."""

    at: dict[tuple[int, int], Sample]
    ranks: list[int]
    days: list[int]
    steps_per_day: int
    checkpoints_per_day: int
    target_days: int = 30
    target_ranks: int = 16_384

    def fit(self, value: Callable[[Sample], float]) -> tuple[float, float]:
        """Exponents of `value` in ranks (at the last day) and in days (at the most ranks)."""
        rmax, dmax = self.ranks[-1], self.days[-1]
        a = slope([float(r) for r in self.ranks], [value(self.at[(r, dmax)]) for r in self.ranks])
        b = slope([float(d) for d in self.days], [value(self.at[(rmax, d)]) for d in self.days])
        return a, b

    def extrapolate(self, value: Callable[[Sample], float], prefix: str) -> float:
        """`value` of a real run at target_days and target_ranks: the measured value at the largest
        sample, times the ratios to the powers of its law (the fitted exponents, rounded), times the kind's real-day scale when the value
        grows with the age of the run (what accumulates per event; a constant, such as one overwritten
        heartbeat, does not)."""
        a, b = (round(x) for x in self.fit(value))  # the law's exponents: small counts bend the raw fit
        rmax, dmax = self.ranks[-1], self.days[-1]
        v = value(self.at[(rmax, dmax)]) * (self.target_days / dmax) ** b * (self.target_ranks / rmax) ** a
        return v * (scale_of(prefix, self.steps_per_day, self.checkpoints_per_day) if b >= 1 else 1)


def _fmt(x: float) -> str:
    if x >= 1e6:
        return f"{x:.3g}"
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def _reads(s: Sample, reader: str, prefix: str | None = None) -> float:
    return float(s.reads[reader].billed(prefix))


def _reader(reader: str, prefix: str | None = None) -> Callable[[Sample], float]:
    return lambda s: _reads(s, reader, prefix)


def _objects(prefix: str) -> Callable[[Sample], float]:
    return lambda s: float(s.objects[prefix])


def _stored(prefix: str) -> Callable[[Sample], float]:
    return lambda s: float(s.stored[prefix])


def kinds_table(g: Grid) -> list[str]:
    rmax, dmax = g.ranks[-1], g.days[-1]
    s = g.at[(rmax, dmax)]
    lines = [
        f"record kinds at {rmax} ranks; per run-day = (at day {dmax}) / {dmax}; real = x scale; "
        f"{g.target_days}d@{g.target_ranks} = extrapolated store objects of a real run",
        f"{'kind':<12} {'objects/day':>11} {'bytes/day':>10} {'puts/day':>9} {'scale':>6} {'real obj/day':>12} "
        f"{'real puts/day':>13} {'x ranks':>7} {'x days':>6} {'obj 30d@16k':>11}  law (objects; bytes)",
    ]
    for p in sorted({p for x in g.at.values() for p in x.objects}):
        k = scale_of(p, g.steps_per_day, g.checkpoints_per_day)
        a, b = g.fit(_objects(p))
        grows = k if round(b) >= 1 else 1
        lines.append(
            f"{p:<12} {s.objects[p] / dmax:>11.1f} {_fmt(s.stored[p] / dmax):>10} {s.writes[p] / dmax:>9.1f} "
            f"{k:>6.0f} {_fmt(s.objects[p] / dmax * grows):>12} {_fmt(s.writes[p] / dmax * k):>13} "
            f"{a:>7.2f} {b:>6.2f} {_fmt(g.extrapolate(_objects(p), p)):>11}  {law(a, b)}; "
            f"{law(*g.fit(_stored(p)))}"
        )
    return lines


def readers_table(g: Grid) -> list[str]:
    rmax, d1, dmax = g.ranks[-1], g.days[0], g.days[-1]
    lines = [
        f"readers at {rmax} ranks: requests (get + head + S3 list pages of 1,000 keys), of them list pages, bytes read, "
        f"day {d1} vs day {dmax}; per kind: requests day {d1}>{dmax} and the law",
        f"{'reader':<8} {'req d' + str(d1):>8} {'req d' + str(dmax):>8} {'ratio':>6} {'pages':>6} "
        f"{'bytes d' + str(d1):>10} {'bytes d' + str(dmax):>10} {'ratio':>6} {'x ranks':>7} {'x days':>6} "
        f"{'req 30d@16k':>11}  law (requests)",
    ]
    for name in READERS:
        c1, cn = g.at[(rmax, d1)].reads[name], g.at[(rmax, dmax)].reads[name]
        a, b = g.fit(_reader(name))
        prefixes = sorted({p for x in g.at.values() for (_o, p) in x.reads[name].requests})
        total = sum(g.extrapolate(_reader(name, p), p) for p in prefixes)
        lines.append(
            f"{name:<8} {c1.billed():>8} {cn.billed():>8} {cn.billed() / max(1, c1.billed()):>6.2f} "
            f"{cn.list_pages():>6} {_fmt(c1.bytes_read()):>10} {_fmt(cn.bytes_read()):>10} "
            f"{cn.bytes_read() / max(1, c1.bytes_read()):>6.2f} {a:>7.2f} {b:>6.2f} {_fmt(total):>11}  {law(a, b)}"
        )
        for p in prefixes:
            pa, pb = g.fit(_reader(name, p))
            lines.append(
                f"{'':<8}   {p or '(root)'}: {_reads(g.at[(rmax, d1)], name, p):.0f}>"
                f"{_reads(g.at[(rmax, dmax)], name, p):.0f} ({law(pa, pb)})"
            )
    return lines


def table(samples: list[Sample], steps_per_day: int, checkpoints_per_day: int) -> str:
    """The side-by-side table: record kinds, then readers (see the module docstring for the scaling)."""
    g = Grid(
        at={(s.ranks, s.day): s for s in samples},
        ranks=sorted({s.ranks for s in samples}),
        days=sorted({s.day for s in samples}),
        steps_per_day=steps_per_day,
        checkpoints_per_day=checkpoints_per_day,
    )
    head = (
        f"simulated day: {steps_per_day} steps, {checkpoints_per_day} checkpoints; real day: "
        f"{REAL_STEPS_PER_DAY} steps (1 s/step), {REAL_CHECKPOINTS_PER_DAY} checkpoints; "
        f"ranks {g.ranks}, days {g.days}"
    )
    return "\n".join([head, "", *kinds_table(g), "", *readers_table(g)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="8,64,256")
    ap.add_argument("--days", default="1,2,4")
    ap.add_argument("--steps-per-day", type=int, default=120)
    ap.add_argument("--checkpoints-per-day", type=int, default=2)
    args = ap.parse_args(argv)
    ranks = [int(x) for x in args.ranks.split(",")]
    days = [int(x) for x in args.days.split(",")]
    t0 = time.monotonic()
    samples: list[Sample] = []
    for r in ranks:
        with tempfile.TemporaryDirectory(prefix="longrun-growth-") as d:
            samples += measure(r, days, args.steps_per_day, args.checkpoints_per_day, Path(d))
    print(table(samples, args.steps_per_day, args.checkpoints_per_day))
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()} "
        f"({os.cpu_count()} cpus, {platform.python_version()}), {time.monotonic() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
