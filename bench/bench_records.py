"""Which record idiom to make the one (issue 27): today's dataclass readers against pydantic v2 and msgspec,
on the record corpus (tests/fixtures/records), side by side in one run.

    python bench/bench_records.py [--seconds 0.05] [--repeats 5]

For four representative kinds, each written as a model the way that library is naturally used:

    manifest     job side, a nested part (`world`) and a list of objects (`files`)
    incident     orchestrator side, a history list (`timeline`) and nested parts four deep
                 (diagnosis.details.probe.result), explicit nulls (closed.healthy_steps)
    promotion    optional fields, one written as null (`previous_step` of the first pointer), fields
                 the class does not declare (`reason`, `validation_key`, `demoted_from`)
    progress     optional fields, a float field written as an integer (`loss`: 2), undeclared fields

it measures, per record and as a ratio to today's dataclass reader and writer:

    (a) read: the stored bytes to a validated object; write: the object to the bytes the store holds
        (json.dumps(sort_keys=True, indent=1), `put_json`'s format, from the library's dict form); and
        the library's native writer (`model_dump_json`, `msgspec.json.encode`), which is not that format
    (b) whether writing back gives the corpus bytes exactly, file by file (and the first difference)
    (c) whether a corrupted record (a missing field, a wrong type; the cases of
        tests/test_record_corpus.py) is refused with an error that names the field; pydantic in its
        default lax mode too (it converts "4" to 4)

and what each library would add to the job side's base install (`training` installs without Airflow:
pydantic and msgspec are in the venv only through Airflow today). The models live here: they are
evaluation code, not the product.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata as md
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType
from pydantic import BaseModel, ConfigDict, ValidationError

from training.records.job import Manifest, Progress
from training.records.orchestrator import Incident, Promotion
from training.store.interface import dump_json

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "fixtures" / "records"
KINDS = ("manifest", "incident", "promotion", "progress")

# ---- pydantic v2 models (strict: the readers face hostile input; extra="allow": keep what a newer writer
# added; written back with model_dump(exclude_unset=True), which keeps a null that was read) -------------


class PBase(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


class PWorld(PBase):
    nodes: list[str] = []
    ranks: list[str] = []
    world_size: int | None = None


class PManifest(PBase):
    schema_version: int
    kind: Literal["manifest"]
    run: str
    step: int
    time: float
    files: list[dict[str, Any]]
    fingerprints: dict[str, Any]
    weight_vote: dict[str, Any]
    coverage: dict[str, Any]
    loss: float | None
    code_version: str
    world: PWorld


class PTimelineEvent(PBase):
    event: str
    time: float | None = None


class PAttribution(PBase):
    verdict: str | None = None
    node: str | None = None
    ranks: list[int] | None = None
    reason: str | None = None
    runbook: str | None = None


class PDrain(PBase):
    node: str | None = None
    reason: str | None = None
    drained_now: bool | None = None
    in_window: int | None = None
    rerun: bool | None = None
    observe: bool | None = None


class PProbeResult(PBase):
    node: str | None = None
    verdict: str | None = None
    fingerprint: str | None = None
    expect: str | None = None
    expected: str | None = None
    duration_s: float | None = None
    torch: str | None = None
    cpu_capability: str | None = None
    threads: int | None = None


class PProbe(PBase):
    verdict: str | None = None
    exit_code: int | None = None
    result: PProbeResult | None = None
    error: str | None = None
    stderr_tail: str | None = None


class PNodeCheck(PBase):
    node: str | None = None
    verdict: str | None = None
    probe: PProbe | None = None
    dcgm: dict[str, Any] | None = None
    stdout_tail: str | None = None
    stderr_tail: str | None = None


class PDiagnosis(PBase):
    node: str | None = None
    verdict: str | None = None
    reason: str | None = None
    summary: str | None = None
    runbook: str | None = None
    duration_s: float | None = None
    exit_code: int | None = None
    details: PNodeCheck | None = None
    reference_node: str | None = None
    dcgm_level: int | None = None
    total_s: float | None = None
    where: str | None = None
    job_id: int | str | None = None
    observe: bool | None = None


class PCheckpoint(PBase):
    step: int | None = None
    key: str | None = None
    why: str | None = None
    lost_steps: int | None = None


class PRelaunch(PBase):
    job_id: int | str | None = None
    nodes: list[str] | None = None
    exclude: list[str] | None = None
    resume_from: str | None = None
    attempt: int | None = None
    note: str | None = None
    params: dict[str, Any] | None = None
    in_job: bool | None = None
    observe: bool | None = None


class PRecovery(PBase):
    milestones_s: dict[str, Any] | None = None
    alert_to_first_healthy_step_s: float | None = None
    relaunch_segment: str | None = None
    pick_step: int | None = None
    start_step: int | None = None
    first_step: int | None = None
    resumed_as_picked: bool | None = None
    lost_steps: int | None = None


class PClosing(PBase):
    time: float | None = None
    by: str | None = None
    reason: str | None = None
    healthy_steps: int | None = None


class PIncident(PBase):
    schema_version: int
    kind: Literal["incident"]
    run: str
    incident_id: str
    alert: dict[str, Any]
    timeline: list[PTimelineEvent]
    mode: Literal["act", "approve", "observe"]
    status: str | None = None
    alert_key: str | None = None
    attribution: PAttribution | None = None
    drain: PDrain | None = None
    diagnosis: PDiagnosis | None = None
    checkpoint: PCheckpoint | None = None
    relaunch: PRelaunch | None = None
    lost_steps: int | None = None
    time_to_recover_s: float | None = None
    runbooks: list[str] | None = None
    reference: PProbeResult | None = None
    recovery: PRecovery | None = None
    closed: PClosing | None = None


class PPromotion(PBase):
    schema_version: int
    kind: Literal["promotion"]
    run: str
    step: int
    manifest_key: str
    time: float
    seq: int
    previous_step: int | None = None
    by: str | None = None


class PProgress(PBase):
    schema_version: int
    kind: Literal["progress"]
    run: str
    step: int
    loss: float | None
    step_time_s: float
    time: float
    total_steps: int | None = None
    world_size: int | None = None
    restart_count: int | None = None


# ---- msgspec structs (UNSET: absent and null told apart; no way to keep an undeclared field) ----------


class MBase(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    pass


class MWorld(MBase):
    nodes: list[str] = msgspec.field(default_factory=list)
    ranks: list[str] = msgspec.field(default_factory=list)
    world_size: int | None | UnsetType = UNSET


class MManifest(MBase):
    schema_version: int
    kind: Literal["manifest"]
    run: str
    step: int
    time: float
    files: list[dict[str, Any]]
    fingerprints: dict[str, Any]
    weight_vote: dict[str, Any]
    coverage: dict[str, Any]
    loss: float | None
    code_version: str
    world: MWorld


class MTimelineEvent(MBase):
    event: str
    time: float | None | UnsetType = UNSET


class MAttribution(MBase):
    verdict: str | None | UnsetType = UNSET
    node: str | None | UnsetType = UNSET
    ranks: list[int] | None | UnsetType = UNSET
    reason: str | None | UnsetType = UNSET
    runbook: str | None | UnsetType = UNSET


class MDrain(MBase):
    node: str | None | UnsetType = UNSET
    reason: str | None | UnsetType = UNSET
    drained_now: bool | None | UnsetType = UNSET
    in_window: int | None | UnsetType = UNSET
    rerun: bool | None | UnsetType = UNSET
    observe: bool | None | UnsetType = UNSET


class MProbeResult(MBase):
    node: str | None | UnsetType = UNSET
    verdict: str | None | UnsetType = UNSET
    fingerprint: str | None | UnsetType = UNSET
    expect: str | None | UnsetType = UNSET
    expected: str | None | UnsetType = UNSET
    duration_s: float | None | UnsetType = UNSET
    torch: str | None | UnsetType = UNSET
    cpu_capability: str | None | UnsetType = UNSET
    threads: int | None | UnsetType = UNSET


class MProbe(MBase):
    verdict: str | None | UnsetType = UNSET
    exit_code: int | None | UnsetType = UNSET
    result: MProbeResult | None | UnsetType = UNSET
    error: str | None | UnsetType = UNSET
    stderr_tail: str | None | UnsetType = UNSET


class MNodeCheck(MBase):
    node: str | None | UnsetType = UNSET
    verdict: str | None | UnsetType = UNSET
    probe: MProbe | None | UnsetType = UNSET
    dcgm: dict[str, Any] | None | UnsetType = UNSET
    stdout_tail: str | None | UnsetType = UNSET
    stderr_tail: str | None | UnsetType = UNSET


class MDiagnosis(MBase):
    node: str | None | UnsetType = UNSET
    verdict: str | None | UnsetType = UNSET
    reason: str | None | UnsetType = UNSET
    summary: str | None | UnsetType = UNSET
    runbook: str | None | UnsetType = UNSET
    duration_s: float | None | UnsetType = UNSET
    exit_code: int | None | UnsetType = UNSET
    details: MNodeCheck | None | UnsetType = UNSET
    reference_node: str | None | UnsetType = UNSET
    dcgm_level: int | None | UnsetType = UNSET
    total_s: float | None | UnsetType = UNSET
    where: str | None | UnsetType = UNSET
    job_id: int | str | None | UnsetType = UNSET
    observe: bool | None | UnsetType = UNSET


class MCheckpoint(MBase):
    step: int | None | UnsetType = UNSET
    key: str | None | UnsetType = UNSET
    why: str | None | UnsetType = UNSET
    lost_steps: int | None | UnsetType = UNSET


class MRelaunch(MBase):
    job_id: int | str | None | UnsetType = UNSET
    nodes: list[str] | None | UnsetType = UNSET
    exclude: list[str] | None | UnsetType = UNSET
    resume_from: str | None | UnsetType = UNSET
    attempt: int | None | UnsetType = UNSET
    note: str | None | UnsetType = UNSET
    params: dict[str, Any] | None | UnsetType = UNSET
    in_job: bool | None | UnsetType = UNSET
    observe: bool | None | UnsetType = UNSET


class MRecovery(MBase):
    milestones_s: dict[str, Any] | None | UnsetType = UNSET
    alert_to_first_healthy_step_s: float | None | UnsetType = UNSET
    relaunch_segment: str | None | UnsetType = UNSET
    pick_step: int | None | UnsetType = UNSET
    start_step: int | None | UnsetType = UNSET
    first_step: int | None | UnsetType = UNSET
    resumed_as_picked: bool | None | UnsetType = UNSET
    lost_steps: int | None | UnsetType = UNSET


class MClosing(MBase):
    time: float | None | UnsetType = UNSET
    by: str | None | UnsetType = UNSET
    reason: str | None | UnsetType = UNSET
    healthy_steps: int | None | UnsetType = UNSET


class MIncident(MBase):
    schema_version: int
    kind: Literal["incident"]
    run: str
    incident_id: str
    alert: dict[str, Any]
    timeline: list[MTimelineEvent]
    mode: Literal["act", "approve", "observe"]
    status: str | None | UnsetType = UNSET
    alert_key: str | None | UnsetType = UNSET
    attribution: MAttribution | None | UnsetType = UNSET
    drain: MDrain | None | UnsetType = UNSET
    diagnosis: MDiagnosis | None | UnsetType = UNSET
    checkpoint: MCheckpoint | None | UnsetType = UNSET
    relaunch: MRelaunch | None | UnsetType = UNSET
    lost_steps: int | None | UnsetType = UNSET
    time_to_recover_s: float | None | UnsetType = UNSET
    runbooks: list[str] | None | UnsetType = UNSET
    reference: MProbeResult | None | UnsetType = UNSET
    recovery: MRecovery | None | UnsetType = UNSET
    closed: MClosing | None | UnsetType = UNSET


class MPromotion(MBase):
    schema_version: int
    kind: Literal["promotion"]
    run: str
    step: int
    manifest_key: str
    time: float
    seq: int
    previous_step: int | None | UnsetType = UNSET
    by: str | None | UnsetType = UNSET


class MProgress(MBase):
    schema_version: int
    kind: Literal["progress"]
    run: str
    step: int
    loss: float | None
    step_time_s: float
    time: float
    total_steps: int | None | UnsetType = UNSET
    world_size: int | None | UnsetType = UNSET
    restart_count: int | None | UnsetType = UNSET


# ---- the codecs ---------------------------------------------------------------------------------------

DATACLASS = {"manifest": Manifest, "incident": Incident, "promotion": Promotion, "progress": Progress}
PYDANTIC: dict[str, type[PBase]] = {
    "manifest": PManifest,
    "incident": PIncident,
    "promotion": PPromotion,
    "progress": PProgress,
}
MSGSPEC: dict[str, type[MBase]] = {
    "manifest": MManifest,
    "incident": MIncident,
    "promotion": MPromotion,
    "progress": MProgress,
}
_DECODERS = {k: msgspec.json.Decoder(t) for k, t in MSGSPEC.items()}
_ENCODER = msgspec.json.Encoder()


class Lib:
    """One idiom: read (bytes -> validated object), write (object -> the store's bytes), native write."""

    def __init__(
        self,
        name: str,
        read: Callable[[str, bytes], Any],
        write: Callable[[Any], bytes],
        native: Callable[[Any], bytes],
    ) -> None:
        self.name, self.read, self.write, self.native = name, read, write, native


LIBS = [
    Lib(
        "dataclass",
        lambda kind, data: DATACLASS[kind].from_json(json.loads(data)),
        lambda obj: dump_json(obj.to_json()),
        lambda obj: json.dumps(obj.to_json()).encode(),
    ),
    Lib(
        "pydantic",
        lambda kind, data: PYDANTIC[kind].model_validate_json(data),
        lambda obj: dump_json(obj.model_dump(mode="json", exclude_unset=True)),
        lambda obj: obj.model_dump_json(exclude_unset=True).encode(),
    ),
    Lib(
        "msgspec",
        lambda kind, data: _DECODERS[kind].decode(data),
        lambda obj: dump_json(msgspec.to_builtins(obj)),
        _ENCODER.encode,
    ),
]

#: (kind, file, field, wrong value or None for "remove it"): the cases of tests/test_record_corpus.py.
CORRUPTIONS: list[tuple[str, str, str, Any]] = [
    ("manifest", "step4", "world", None),
    ("manifest", "step4", "world.world_size", "4"),
    ("incident", "closed_full", "timeline", None),
    ("incident", "closed_full", "mode", 1),
    ("incident", "closed_full", "drain.in_window", "one"),
    ("incident", "closed_full", "diagnosis.details.probe.result.threads", "8"),
    ("promotion", "history_second", "seq", None),
    ("promotion", "history_second", "previous_step", "4"),
    ("progress", "first", "step_time_s", None),
    ("progress", "first", "restart_count", "0"),
    ("progress", "first", "step", True),
]


def corpus() -> dict[str, list[tuple[str, bytes]]]:
    return {k: [(p.name, p.read_bytes()) for p in sorted((CORPUS / k).glob("*.json"))] for k in KINDS}


def per_record_s(fn: Callable[[], None], n: int, seconds: float, repeats: int) -> float:
    """Best of `repeats` timings of `fn` (which handles `n` records) looped for about `seconds`."""
    loops = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        if (dt := time.perf_counter() - t0) >= seconds / 4 or loops > 1 << 20:
            break
        loops *= 4
    loops = max(1, int(loops * seconds / max(dt, 1e-9)))
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        best.append((time.perf_counter() - t0) / (loops * n))
    return min(best)


def first_difference(a: bytes, b: bytes) -> str:
    la, lb = a.decode().splitlines(), b.decode().splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return f"line {i + 1}: {x.strip()[:48]!r} -> {y.strip()[:48]!r}"
    return f"{len(la)} lines -> {len(lb)} lines" + (
        f": lost {la[len(lb)].strip()[:48]!r}" if len(la) > len(lb) else ""
    )


def corrupt(data: bytes, field: str, value: Any) -> bytes:
    obj = json.loads(data)
    *path, last = field.split(".")
    target = obj
    for name in path:
        target = target[name]
    if value is None:
        del target[last]
    else:
        target[last] = value
    return json.dumps(copy.deepcopy(obj), indent=1).encode()


def refusal(read: Callable[[], Any], field: str) -> str:
    """'named' | 'unnamed: <error>' | 'ACCEPTED' | 'crash: <error>'."""
    leaf = field.rsplit(".", 1)[-1]
    try:
        read()
    except (ValueError, ValidationError, msgspec.ValidationError) as e:  # pydantic's is a ValueError too
        return "named" if leaf in str(e) else f"unnamed: {str(e).splitlines()[0][:60]}"
    except Exception as e:
        return f"crash: {type(e).__name__}: {e}"[:70]
    return "ACCEPTED"


def install_cost(dists: list[str]) -> str:
    size = sum(sum((f.size or 0) for f in md.distribution(d).files or []) for d in dists)
    return f"{', '.join(f'{d} {md.version(d)}' for d in dists)}: {size / 2**20:.1f} MiB installed"


def import_s(module: str, repeats: int = 3) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout) for _ in range(repeats)]  # fmt: skip
    return min(runs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=0.05, help="time per measurement (each repeated)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    files = corpus()
    print(f"command: {' '.join(['python', 'bench/bench_records.py', *sys.argv[1:]])}")
    print(f"python {sys.version.split()[0]}, pydantic {md.version('pydantic')} (core {md.version('pydantic_core')}), "
          f"msgspec {md.version('msgspec')}; corpus {CORPUS.relative_to(REPO)}; best of {args.repeats}")  # fmt: skip
    print("\n(a) time per record, microseconds (ratio to the dataclass); write = the store's bytes")
    print(f"{'kind':<10} {'files':>5} {'op':<13}" + "".join(f"{lib.name:>20}" for lib in LIBS))
    ratios: dict[tuple[str, str], list[float]] = {}
    for kind in KINDS:
        recs = files[kind]
        objs = {lib.name: [lib.read(kind, d) for _n, d in recs] for lib in LIBS}
        for op in ("read", "write", "native write"):
            row, base = [], None
            for lib in LIBS:
                if op == "read":
                    fn = lambda lib=lib, kind=kind, recs=recs: [lib.read(kind, d) for _n, d in recs]  # noqa: E731
                else:
                    w = lib.write if op == "write" else lib.native
                    fn = lambda w=w, o=objs[lib.name]: [w(x) for x in o]  # noqa: E731
                t = per_record_s(fn, len(recs), args.seconds, args.repeats)
                base = base or t
                ratios.setdefault((lib.name, op), []).append(t / base)
                row.append(f"{t * 1e6:>10.1f} (x{t / base:4.2f})")
            print(f"{kind:<10} {len(recs):>5} {op:<13}" + "".join(f"{c:>20}" for c in row))
    print("geometric mean of the ratios over the four kinds:")
    for op in ("read", "write", "native write"):
        cells = [f"{lib.name} x{statistics.geometric_mean(ratios[(lib.name, op)]):.2f}" for lib in LIBS]
        print(f"  {op:<13} " + "   ".join(cells))

    print("\n(b) write-back gives the corpus bytes (read, then write the store's bytes)")
    for kind in KINDS:
        for name, data in files[kind]:
            cells = []
            for lib in LIBS:
                try:
                    out = lib.write(lib.read(kind, data))
                    cells.append("same" if out == data else f"DIFFERS {first_difference(data, out)}")
                except Exception as e:
                    cells.append(f"REFUSED {type(e).__name__}")
            print(
                f"  {kind + '/' + name:<34} "
                + " | ".join(f"{lib.name}: {c}" for lib, c in zip(LIBS, cells, strict=True))
            )

    print("\n(c) a corrupted record is refused naming the field")
    names = [lib.name for lib in LIBS[:2]] + ["pydantic lax", LIBS[2].name]
    print(f"  {'case':<70}" + "".join(f"{n:>14}" for n in names))
    counts = dict.fromkeys(names, 0)
    for kind, file, field, value in CORRUPTIONS:
        data = corrupt((CORPUS / kind / f"{file}.json").read_bytes(), field, value)
        reads = [
            lambda kind=kind, data=data: LIBS[0].read(kind, data),
            lambda kind=kind, data=data: LIBS[1].read(kind, data),
            lambda kind=kind, data=data: PYDANTIC[kind].model_validate_json(data, strict=False),
            lambda kind=kind, data=data: LIBS[2].read(kind, data),
        ]
        cells = [refusal(r, field) for r in reads]
        for n, c in zip(names, cells, strict=True):
            counts[n] += c == "named"
        case = f"{kind}/{file}: {field} " + ("removed" if value is None else f"= {value!r}")
        print(f"  {case:<70}" + "".join(f"{c.split(':')[0]:>14}" for c in cells))
    print("  named: " + ", ".join(f"{n} {counts[n]}/{len(CORRUPTIONS)}" for n in names))

    print("\nwhat the job side's base install would add (it has typing-extensions already, through torch):")
    print(f"  pydantic: {install_cost(['pydantic', 'pydantic_core', 'annotated-types', 'typing-inspection'])}"
          f"; import {import_s('pydantic') * 1e3:.0f} ms")  # fmt: skip
    print(f"  msgspec:  {install_cost(['msgspec'])}; import {import_s('msgspec') * 1e3:.0f} ms")
    print(
        f"  today:    training.records {import_s('training.records') * 1e3:.0f} ms to import, nothing to install"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
