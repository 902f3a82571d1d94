"""The replay probe's reference: a known-good fingerprint per partition, computed on a healthy node.

`run_reference` is the one way it is computed: the probe (`python -m training.probe --node N`) on a healthy
node, run by the caller's runner: in a MAINT reservation (health.diagnose.reference) or as a step of a
job that holds the node (longrun.incident.hot_spare.reference_in_job).

The diagnosis compares the suspect node's probe fingerprint with it. It is only valid for the same
software and CPU level (`ProbeResult.env`: torch, CPU capability, threads): a reference from another
environment makes no verdict.
Orchestrator side of the store (`ops/probe-reference/<partition>.json`), written once (If-None-Match).

The cached object is hostile input like any other record read back (docs/architecture.md): it is used
only when it reads as a reference (`checked_reference`): the probe's own JSON of a run without
`--expect` (verdict `no-reference`), a 16-digit lower-case hex fingerprint, the whole environment, and a
node other than the suspect. Anything else is never used: the caller computes a fresh reference (and
replaces an unreadable cached one), or stops with the node drained. Whichever reference is used, a pass
is recorded only when the suspect's own probe gave the same fingerprint in the same environment
(`confirms`): a reference that does not fit the node's run gives `error`, never `pass`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from longrun.health import node_check
from longrun.slurm import validate as v
from longrun.slurm.errors import SlurmCommandError
from longrun.slurm.models import CommandResult
from training.records.diagnosis import ProbeResult
from training.records.orchestrator import Incident as IncidentRecord
from training.records.schema import SchemaError
from training.store.interface import ObjectStore, StoreError, dump_json
from training.store.update import create_once, update_json

_HEX16 = re.compile(r"[0-9a-f]{16}")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class NoReference(SlurmCommandError):
    """The reference probe ran and gave no fingerprint; the message says what it printed."""


def run_reference(
    run: Callable[[tuple[str, ...]], CommandResult],
    *,
    node: str,
    python: str | None = None,
    state_dir: str | None = None,
    where: str = "",
) -> dict[str, Any]:
    """The probe's JSON verdict (with `fingerprint`) on the healthy `node`: `run` runs the probe's argv
    there and returns its result; `where` says how, for the error (e.g. " (step of job 7)"). NoReference
    when the probe gives no fingerprint; what `run` raises passes through."""
    argv: tuple[str, ...] = (python or sys.executable, "-m", "training.probe", "--node", node)
    if state_dir:
        argv += ("--state-dir", v.path("state_dir", state_dir))
    result = run(argv)
    obj = node_check.last_json_line(result.stdout)
    if result.exit_code != 0 or not obj or not obj.get("fingerprint"):
        raise NoReference(
            f"the reference probe on {node}{where} gave no fingerprint (rc {result.exit_code}): "
            f"{json.dumps(obj) if obj else result.stdout[-500:]} {result.stderr[-500:]}"
        )
    return obj


def _reference_key(partition: str) -> str:
    return f"ops/probe-reference/{partition}.json"


def checked_reference(obj: Any, *, suspect: str | None = None) -> ProbeResult | None:
    """`obj` as a usable reference, or None (why does not matter to the caller: it is never used)."""
    try:
        ref = ProbeResult.from_json(obj)
    except SchemaError:
        return None
    ok = (
        ref.verdict == "no-reference"
        and isinstance(ref.fingerprint, str)
        and _HEX16.fullmatch(ref.fingerprint) is not None
        and isinstance(ref.node, str)
        and _NODE.fullmatch(ref.node) is not None
        and ref.node != suspect
        and all(e not in (None, "") for e in ref.env)
    )
    return ref if ok else None


def cached_reference(
    store: ObjectStore, partition: str, *, suspect: str | None = None
) -> dict[str, Any] | None:
    """A known-good probe result from an earlier incident in this partition (nodes of one kind) that
    passes `checked_reference`, or None."""
    try:
        obj = json.loads(store.get_bytes(_reference_key(partition)))
    except (StoreError, ValueError):
        return None
    return dict(obj) if checked_reference(obj, suspect=suspect) is not None else None


def reference_of(rec: IncidentRecord) -> ProbeResult | None:
    """The reference an earlier try of this incident recorded (event `reference`, field `reference`), or
    None."""
    return rec.reference or None


def remember_reference(store: ObjectStore, partition: str, ref: Mapping[str, Any]) -> None:
    """Cache a freshly computed reference. Written once; a cached object that is unusable (garbled, not a
    reference) or disagrees with this fresh one (fingerprint or environment) is replaced, conditionally on
    its version, so that a bad entry cannot stay for good."""
    if checked_reference(dict(ref)) is None:
        return  # never cache what would not be used
    key = _reference_key(partition)
    if create_once(store, key, dump_json(dict(ref))):
        return
    # One is there already (ours, or a concurrent incident's: equal by construction, unless bad).

    def replace_unless_same(data: bytes) -> dict[str, Any] | None:
        try:
            old = checked_reference(json.loads(data))
        except ValueError:
            old = None  # garbled: replaced
        new = ProbeResult.from_json(dict(ref))
        if old is not None and (old.fingerprint, old.env) == (new.fingerprint, new.env):
            return None
        return dict(ref)

    try:  # one try, on condition of the version compared
        update_json(
            store, key, replace_unless_same, dump=dump_json, load=bytes, attempts=1, what="probe reference"
        )
    except (StoreError, ValueError):
        pass  # deleted or changed meanwhile, or unreadable: the next fresh reference tries again


def comparable(known: ProbeResult, probe: Mapping[str, Any]) -> bool:
    """Was the probe run `probe` (its JSON, as the probe wrote it) made in the reference's environment (same
    torch, CPU level, threads)? A result that does not read as a probe result is not comparable."""
    try:
        return ProbeResult.from_json(dict(probe)).env == known.env
    except SchemaError:
        return False


def confirms(known: ProbeResult, probe: ProbeResult | None) -> bool:
    """Does the suspect's probe run match the reference: the same fingerprint, in the same environment?
    The one condition under which a diagnosis may say `pass`."""
    return (
        probe is not None
        and probe.fingerprint is not None
        and probe.fingerprint == known.fingerprint
        and probe.env == known.env
    )


def judge_fresh(probe: ProbeResult | None, fresh: ProbeResult) -> tuple[str, str]:
    """The verdict (pass, fail or error) and a note, for a node whose probe matched a stored reference,
    against a reference computed just now: pass on a match, fail on another fingerprint in the same
    environment (the stored reference was wrong), else error (not comparable)."""
    if confirms(fresh, probe):
        return "pass", f"; confirmed by a fresh reference on {fresh.node}"
    if probe is not None and probe.fingerprint and probe.env == fresh.env:
        return "fail", f"; a fresh reference on {fresh.node} is {fresh.fingerprint}: the stored one was wrong"
    return "error", f"; the fresh reference on {fresh.node} is not comparable"
