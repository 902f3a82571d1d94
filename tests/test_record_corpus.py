"""The round-trip guard of issue 27's record refactor: every record in tests/fixtures/records/, written by
the code of before the refactor, must read with today's reader of its kind and write back with today's
writer to the same bytes; every record kind has a corpus entry; a corrupted record is refused with an
error that names the field.

A kind's reader and writer are the ones the code uses on the store (`CODECS`): the writer's bytes come
from the writer's own function (`put_json`, `training.store.interface.dump_json`,
`history.append`, `hot_spare._write`, `EventWriter.flush`), called on an in-memory store, never from a copy
of its format. A case today's code fails is a strict xfail naming the gap (`ROUND_TRIP_GAPS`,
`NAMING_GAPS`): none is left.
"""

from __future__ import annotations

import ast
import copy
import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from longrun.health import history, probe_reference, ratelimit
from longrun.incident import hot_spare
from longrun.monitor.event import MonitorEvent
from longrun.nodes.outcome import NodeProbe, NodeReturn

from training.checkpoint.manifest import read_manifest
from training.events import EventWriter
from training.records import KINDS
from training.records.diagnosis import ProbeResult
from training.records.job import CheckRecord, Manifest
from training.records.orchestrator import Incident as IncidentRecord
from training.spares.directive import Directive
from training.store.interface import NotFound, ObjectInfo, PreconditionFailed, dump_json, put_json

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "fixtures" / "records"


class MemStore:
    """Just enough of an ObjectStore to call a writer (or `ratelimit._read`) on one object."""

    def __init__(self, objects: dict[str, bytes] | None = None) -> None:
        self.objects = dict(objects or {})

    def _info(self, key: str) -> ObjectInfo:
        return ObjectInfo(key=key, size=len(self.objects[key]), etag=str(hash(self.objects[key])))

    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> ObjectInfo:
        if if_none_match and key in self.objects:
            raise PreconditionFailed(key)
        if if_match is not None and (key not in self.objects or self._info(key).etag != if_match):
            raise PreconditionFailed(key)
        self.objects[key] = bytes(data)
        return self._info(key)

    def get_bytes(self, key: str) -> bytes:
        if key not in self.objects:
            raise NotFound(key)
        return self.objects[key]

    def head(self, key: str) -> ObjectInfo | None:
        return self._info(key) if key in self.objects else None

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return iter([self._info(k) for k in sorted(self.objects) if k.startswith(prefix)])

    def list_dirs(self, prefix: str) -> Iterator[str]:
        rests = (k[len(prefix) :] for k in self.objects if k.startswith(prefix))
        return iter(sorted({f"{prefix}{rest.split('/', 1)[0]}/" for rest in rests if "/" in rest}))

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    def describe(self) -> str:
        return "memory"

    def only(self) -> bytes:
        (data,) = self.objects.values()
        return data


# ---- each kind's reader and writer, as the code uses them on the store -----------------------------


def _put_json(obj: Any) -> bytes:
    """The bytes `training.store.interface.put_json` writes for `obj` (most records' writer)."""
    store = MemStore()
    put_json(store, "k", obj)
    return store.only()


def _typed(cls: Any) -> Callable[[bytes], Any]:
    return lambda data: cls.from_json(json.loads(data))


def _read_checks(data: bytes) -> list[CheckRecord]:
    return [CheckRecord.from_json(json.loads(line)) for line in data.decode().splitlines()]


def _write_checks(recs: list[CheckRecord]) -> bytes:
    """`EventWriter.check` then `flush`: one batch file, as every rank writes it."""
    store = MemStore()
    with tempfile.TemporaryDirectory() as tmp:
        w = EventWriter(
            run=recs[0].run,
            run_dir=Path(tmp),
            store=store,
            rank=1,
            flush_every=1 << 30,
            progress_interval_s=60,
        )
        for r in recs:
            w.check(r.to_json())
        w.flush()
        w.close()
    return store.only()


def _write_incident(rec: IncidentRecord) -> bytes:
    return dump_json(rec.to_json())


def _write_node_event(ev: history.NodeEvent) -> bytes:
    store = MemStore()
    history.append(store, ev)
    return store.only()


def _write_directive(d: Directive) -> bytes:
    store = MemStore()
    hot_spare._write(store, d)
    return store.only()


@dataclass(frozen=True)
class Ledger:
    """The drain ledger as `reserve_drain` holds it: the object, its entries typed (`DrainEntry`)."""

    obj: dict[str, Any]
    entries: list[ratelimit.DrainEntry]


def _read_ledger(data: bytes) -> Ledger:
    obj, _etag = ratelimit._read(MemStore({ratelimit.LEDGER_KEY: data}))
    return Ledger(obj, [ratelimit.DrainEntry.from_json(e) for e in obj["entries"]])


def _write_ledger(ledger: Ledger) -> bytes:
    # reserve_drain writes json.dumps(ledger, sort_keys=True, indent=1) inline (three times): put_json's bytes.
    return _put_json({**ledger.obj, "entries": [e.to_json() for e in ledger.entries]})


def _read_probe_reference(data: bytes) -> ProbeResult:
    ref = ProbeResult.from_json(json.loads(data))
    assert probe_reference.checked_reference(ref.to_json()) is not None, "not a usable reference"
    return ref


def _xcom(obj: Any) -> bytes:
    """XCom kinds: Airflow's encoder writes them; the corpus holds json.dumps(to_json(), indent=1)."""
    return json.dumps(obj.to_json(), indent=1).encode()


@dataclass(frozen=True)
class Codec:
    read: Callable[[bytes], Any]
    write: Callable[[Any], bytes]
    where: str
    """Where the kind is defined (for people)."""


def _record(cls: Any, where: str, write: Callable[[Any], bytes] | None = None) -> Codec:
    return Codec(_typed(cls), write or (lambda r: _put_json(r.to_json())), where)


CODECS: dict[str, Codec] = {
    **{
        kind: _record(KINDS[kind], f"training.records ({KINDS[kind].__name__})")
        for kind in ("alert", "progress", "report", "validation", "promotion", "pick", "suspect")
        + ("run_claim", "security_event", "alert_key", "incident_lock", "run_launch", "alert_claim")
        + ("drill_grant", "incident_join")
    },
    "segment": _record(KINDS["segment"], "training.segment"),
    "fault": _record(KINDS["fault"], "training.segment"),
    "check": Codec(_read_checks, _write_checks, "training.records.job:CheckRecord (checks/*.jsonl)"),
    "manifest": Codec(
        lambda data: Manifest.from_json(read_manifest(data, "corpus")),
        lambda m: dump_json(m.to_json()),
        "training.records.job:Manifest",
    ),
    "save": _record(KINDS["save"], "training.records.job:Save", lambda r: dump_json(r.to_json())),
    "incident": _record(IncidentRecord, "training.records.orchestrator:Incident", _write_incident),
    "directive": _record(Directive, "training.spares.directive", _write_directive),
    "node_event": _record(history.NodeEvent, "longrun.health.history", _write_node_event),
    "drain_ledger": Codec(
        _read_ledger, _write_ledger, "longrun.health.ratelimit (DrainEntry; no ledger class)"
    ),
    "probe_reference": Codec(
        _read_probe_reference,
        lambda r: _put_json(r.to_json()),
        "longrun.health.probe_reference (ProbeResult)",
    ),
    "monitor_event": Codec(_typed(MonitorEvent), _xcom, "longrun.monitor.event (XCom)"),
    "node_probe": Codec(_typed(NodeProbe), _xcom, "longrun.nodes.outcome (XCom)"),
    "node_return": Codec(_typed(NodeReturn), _xcom, "longrun.nodes.outcome (XCom)"),
}

#: The record kinds outside `training.records.KINDS`: stored records without a registry entry, and the
#: records that travel by XCom.
OTHER_KINDS = frozenset(
    {"drain_ledger", "probe_reference", "incident_join", "monitor_event", "node_probe", "node_return"}
)

#: Every class with a record reader or writer (from_json/to_json/from_dict/to_dict, or a Record or Part),
#: by "module:Class": the corpus kind it is, or why it has no corpus entry of its own.
RECORD_CLASSES: dict[str, str] = {
    "training.records.alert:Alert": "alert",
    "training.records.job:CheckRecord": "check",
    "training.records.job:Progress": "progress",
    "training.records.job:Manifest": "manifest",
    "training.records.job:Save": "save",
    "training.records.job:Report": "report",
    "training.records.orchestrator:Validation": "validation",
    "training.records.orchestrator:Promotion": "promotion",
    "training.records.orchestrator:Pick": "pick",
    "training.records.orchestrator:SuspectMark": "suspect",
    "training.records.orchestrator:Incident": "incident",
    "training.segment:Segment": "segment",
    "training.segment:FaultFired": "fault",
    "training.spares.directive:Directive": "directive",
    "longrun.health.history:NodeEvent": "node_event",
    "longrun.runclaim:RunClaim": "run_claim",
    "longrun.security_events:SecurityEvent": "security_event",
    "longrun.alert_auth:AlertKey": "alert_key",
    "longrun.incident.exclusive:IncidentLock": "incident_lock",
    "longrun.incident.exclusive:IncidentJoin": "incident_join",
    "longrun.monitor.launches:RunLaunch": "run_launch",
    "longrun.incident.alert_identity:AlertClaim": "alert_claim",
    "longrun.drill_grant:DrillGrant": "drill_grant",
    "longrun.health.ratelimit:DrainEntry": "drain_ledger",
    "longrun.monitor.event:MonitorEvent": "monitor_event",
    "longrun.nodes.outcome:NodeProbe": "node_probe",
    "longrun.nodes.outcome:NodeReturn": "node_return",
    # parts of a kind above, in its corpus files
    "training.records.diagnosis:ProbeResult": "probe_reference",  # also the incident's `reference`
    "training.records.alert:World": "nested: manifest.world, alert.evidence.world",
    "training.records.alert:AlertRef": "nested: a tolerant view of incident.alert",
    "training.records.job:ReportOrchestrator": "nested: a tolerant view of report.orchestrator",
    "training.records.orchestrator:TimelineEvent": "nested: incident.timeline",
    "training.records.diagnosis:Probe": "nested: incident.diagnosis.details.probe",
    "training.records.diagnosis:NodeCheck": "nested: incident.diagnosis.details",
    "training.records.diagnosis:Diagnosis": "nested: incident.diagnosis (also an XCom result)",
    "training.records.incident:Attribution": "nested: incident.attribution",
    "training.records.incident:RestartCheckpoint": "nested: incident.checkpoint",
    "training.records.incident:Relaunch": "nested: incident.relaunch",
    "training.records.incident:Drain": "nested: incident.drain",
    "training.records.incident:Recovery": "nested: incident.recovery",
    "training.records.incident:Closing": "nested: incident.closed",
    "longrun.monitor.event:Carry": "nested: monitor_event.carry",
    # the idioms themselves
    "training.records.base:RecordType": "base: the protocol",
    "training.records.base:Record": "base: the Record mixin",
    "training.records.base:Part": "base: the Part mixin",
    "training.records.base:Declared": "base: the Declared mixin",
    # not records: nothing reads them back as a record
    "longrun.incident.attribution:AttributionOutcome": "not a record: a step's result, stored as incident.attribution",
    "longrun.health.diagnose:DiagnosisOutcome": "not a record: a step's result, stored as incident.diagnosis",
    "longrun.health.dcgm:DcgmVerdict": "not a record: DCGM's verdict, stored in incident.diagnosis.details.dcgm",
    "longrun.incident.keep_drained:Restored": "not a record: a step's result (XCom and a timeline event)",
    "longrun.health.policy:NodePolicy": "not a record: configuration (an Airflow Variable)",
    "longrun.health.policy:Standing": "not a record: a display value",
    "longrun.slurm.models:JobState": "not a record: Slurm's state of a job (in monitor_event.state)",
    "longrun.slurm.spec:JobSpec": "not a record: a job's submission spec",
}

_METHODS = {"from_json", "to_json", "from_dict", "to_dict"}


def _record_classes() -> set[str]:
    found = set()
    for root, package in ((REPO / "training", "training"), (REPO / "plugins" / "longrun", "longrun")):
        for path in sorted(root.rglob("*.py")):
            module = ".".join((package, *path.relative_to(root).with_suffix("").parts)).removesuffix(
                ".__init__"
            )
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ClassDef):
                    continue
                methods = {m.name for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)}
                bases = {getattr(b, "id", getattr(b, "attr", None)) for b in node.bases}
                if methods & _METHODS or bases & {"Record", "Part", "Declared"}:
                    found.add(f"{module}:{node.name}")
    return found


def _files() -> list[Path]:
    return sorted(p for p in CORPUS.glob("*/*") if p.suffix in (".json", ".jsonl"))


def _kind(path: Path) -> str:
    return path.parent.name


# ---- the corpus covers every kind -------------------------------------------------------------------


def test_every_kind_has_a_codec_and_a_corpus_file() -> None:
    kinds = set(KINDS) | OTHER_KINDS
    assert kinds == set(CODECS), f"kinds without a codec here: {sorted(kinds - set(CODECS))}"
    present = {_kind(p) for p in _files()}
    missing = sorted(kinds - present)
    assert not missing, (
        f"record kinds without a corpus file: {missing}; add them to tests/fixtures/records/generate.py"
    )
    stray = sorted(present - kinds)
    assert not stray, f"corpus folders that are no record kind: {stray}"


def test_every_record_class_is_a_corpus_kind_or_explained() -> None:
    """A new class with a record reader or writer fails here until it has a corpus kind (and a codec) or a
    reason in RECORD_CLASSES. Compared by class name, so a module move does not fail it."""
    found = {c.split(":")[1]: c for c in _record_classes()}
    known = {c.split(":")[1]: c for c in RECORD_CLASSES}
    assert len(found) == len(_record_classes()), (
        "two record classes share a name: key RECORD_CLASSES by module"
    )
    new = sorted(found[n] for n in set(found) - set(known))
    assert not new, f"record classes the corpus does not know: {new}; add a corpus kind or a reason"
    gone = sorted(known[n] for n in set(known) - set(found))
    assert not gone, f"RECORD_CLASSES names classes that are no longer there: {gone}"
    kinds = {v for v in RECORD_CLASSES.values() if ":" not in v}
    assert kinds <= set(CODECS), sorted(kinds - set(CODECS))


# ---- round trip: read with today's reader, write with today's writer, same bytes ---------------------

#: Corpus files today's code does not give back byte for byte (the reader refuses them, or the writer
#: drops what it read): file -> why. Strict: once the refactor fixes one, its entry must go.
ROUND_TRIP_GAPS: dict[str, str] = {}


def _round_trip_params() -> list[Any]:
    out = []
    for p in _files():
        rel = f"{_kind(p)}/{p.name}"
        marks = (
            [pytest.mark.xfail(strict=True, reason=ROUND_TRIP_GAPS[rel])] if rel in ROUND_TRIP_GAPS else []
        )
        out.append(pytest.param(p, id=rel, marks=marks))
    return out


@pytest.mark.parametrize("path", _round_trip_params())
def test_round_trip_is_byte_identical(path: Path) -> None:
    codec = CODECS[_kind(path)]
    data = path.read_bytes()
    assert codec.write(codec.read(data)) == data


def test_round_trip_gaps_name_corpus_files() -> None:
    names = {f"{_kind(p)}/{p.name}" for p in _files()}
    assert set(ROUND_TRIP_GAPS) <= names, sorted(set(ROUND_TRIP_GAPS) - names)


# ---- a corrupted record is refused, naming the field ------------------------------------------------

_ABSENT = object()


@dataclass(frozen=True)
class Corruption:
    file: str
    field: str
    """The field, dotted into nested objects (`drain.in_window`); in a .jsonl file, of its first line."""
    value: Any = _ABSENT
    """The wrong value; absent: the field is removed."""


def _missing(file: str, field: str) -> Corruption:
    return Corruption(file, field)


def _wrong(file: str, field: str, value: Any) -> Corruption:
    return Corruption(file, field, value)


CORRUPTIONS: dict[str, list[Corruption]] = {
    "alert": [_missing("recompute_signed", "suspect_nodes"), _wrong("recompute_signed", "step", "14")],
    "check": [_missing("rank0_batch", "verdict"), _wrong("rank0_batch", "rank", "0")],
    "progress": [_missing("first", "step_time_s"), _wrong("first", "restart_count", "0")],
    "manifest": [_missing("step4", "world"), _wrong("step4", "world.world_size", "4")],
    "save": [_missing("uploaded", "ok"), _wrong("uploaded", "nbytes", "512")],
    "report": [_missing("job_only", "final_fingerprint"), _wrong("job_only", "final_step", 40.5)],
    "validation": [_missing("passed", "errors"), _wrong("passed", "manifest_etag", 5)],
    "promotion": [_missing("history_second", "seq"), _wrong("history_second", "previous_step", "4")],
    "pick": [_missing("chosen", "why"), _wrong("chosen", "bound", "12")],
    "suspect": [_missing("by_incident", "after_step"), _wrong("by_incident", "incident_id", 7)],
    "incident": [
        _missing("closed_full", "timeline"),
        _wrong("closed_full", "mode", 1),
        _wrong("closed_full", "drain.in_window", "one"),
        _wrong("closed_full", "diagnosis.details.probe.result.threads", "8"),
    ],
    "segment": [_missing("started", "started_at"), _wrong("started", "nodes", "gpu-a01")],
    "fault": [_missing("scale", "spec"), _wrong("scale", "rank", "2")],
    "directive": [_missing("attempt1", "exclude"), _wrong("attempt1", "attempt", "1")],
    "node_event": [_missing("suspected", "source"), _wrong("suspected", "evidence", [])],
    "run_claim": [_missing("claimed", "dag_run_id"), _wrong("claimed", "claimed_at", "yesterday")],
    "security_event": [_missing("bad_signature", "reason"), _wrong("bad_signature", "details", "x")],
    "alert_key": [_missing("bound_to_job", "key"), _wrong("bound_to_job", "job_id", "4242")],
    "incident_lock": [_missing("held", "job_id"), _wrong("held", "acquired_at", True)],
    "run_launch": [_missing("relaunch", "params"), _wrong("relaunch", "job_id", "4243")],
    "alert_claim": [_missing("claimed", "incident_id"), _wrong("claimed", "claimed_at", "now")],
    "drill_grant": [_missing("ended", "dag_run_id"), _wrong("ended", "step", "17")],
    "drain_ledger": [_missing("two_entries", "entries"), _wrong("two_entries", "entries.0.time", "now")],
    # every field of a probe result is optional: only a wrong type can be refused
    "probe_reference": [_wrong("h200", "fingerprint", 123)],
    "incident_join": [_missing("joined", "joined"), _wrong("joined", "joined", 5)],
    "monitor_event": [_missing("alert", "seen"), _wrong("alert", "carry.promoted", "x")],
    "node_probe": [_missing("clean", "node"), _wrong("clean", "rounds", "all")],
    "node_return": [_missing("returned", "node"), _wrong("returned", "returned", "no")],
}

#: Corruptions today's readers accept, or refuse without naming the field: "kind/file:field" -> why.
NAMING_GAPS: dict[str, str] = {}


def _case_id(kind: str, c: Corruption) -> str:
    return f"{kind}/{c.file}:{c.field}"


def _corrupt_params() -> list[Any]:
    out = []
    for kind, cases in CORRUPTIONS.items():
        for c in cases:
            cid = _case_id(kind, c)
            how = "missing" if c.value is _ABSENT else "wrong_type"
            marks = [pytest.mark.xfail(strict=True, reason=NAMING_GAPS[cid])] if cid in NAMING_GAPS else []
            out.append(pytest.param(kind, c, id=f"{cid}:{how}", marks=marks))
    return out


def _corrupt(obj: Any, c: Corruption) -> Any:
    *path, last = c.field.split(".")
    target = obj
    for name in path:
        target = target[int(name)] if isinstance(target, list) else target[name]
    if c.value is _ABSENT:
        del target[last]
    else:
        target[last] = c.value
    return obj


def _file(kind: str, name: str) -> Path:
    (path,) = [p for p in (CORPUS / kind).glob(f"{name}.*") if p.suffix in (".json", ".jsonl")]
    return path


@pytest.mark.parametrize(("kind", "corruption"), _corrupt_params())
def test_corrupted_record_is_refused_naming_the_field(kind: str, corruption: Corruption) -> None:
    codec = CODECS[kind]
    path = _file(kind, corruption.file)
    text = path.read_text()
    if path.suffix == ".jsonl":  # the batch's first line
        first, _, rest = text.partition("\n")
        data = json.dumps(_corrupt(json.loads(first), corruption), sort_keys=True) + "\n" + rest
    else:
        data = json.dumps(_corrupt(copy.deepcopy(json.loads(text)), corruption), indent=1)
    with pytest.raises(Exception) as err:  # noqa: B017 - which class is the next assertion's business
        codec.read(data.encode())
    # A refusal is a ValueError (SchemaError) or the reader's own error (a manifest's CheckpointError); a
    # KeyError or TypeError is a reader that tripped over the record, not one that checked it.
    assert not isinstance(err.value, KeyError | TypeError | AttributeError | IndexError), repr(err.value)
    leaf = corruption.field.rsplit(".", 1)[-1]
    named = (f"'{corruption.field}'", f"'{leaf}'")
    assert any(n in str(err.value) for n in named), (
        f"the error does not name {corruption.field!r}: {err.value}"
    )


def test_corruptions_cover_every_kind() -> None:
    assert set(CORRUPTIONS) == set(CODECS), sorted(set(CODECS) ^ set(CORRUPTIONS))
    ids = {_case_id(k, c) for k, cases in CORRUPTIONS.items() for c in cases}
    assert set(NAMING_GAPS) <= ids, sorted(set(NAMING_GAPS) - ids)
