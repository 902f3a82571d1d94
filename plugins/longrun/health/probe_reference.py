"""The replay probe's reference: a known-good fingerprint per partition, computed on a healthy node, and
the one choice of the reference a diagnosis compares with (`choose_reference`).

`run_reference` is the one way it is computed: the probe (`python -m training.probe --node N`) on a healthy
node, run by the caller's runner, which says how. The answer is stamped on the result (field `computed`,
over anything the probe printed under that name):

- isolated (`isolated_mark`): by the orchestrator, in a job of its own inside a MAINT reservation on an
  idle node, so on a node outside the suspect's job (health.diagnose.reference). No job can write its
  inputs or outputs.
- in_job (`in_job_mark`): as a step of a running job that holds the node (`srun --jobid --overlap`:
  longrun.incident.hot_spare.reference_in_job). It runs as that job's user, beside the job's own
  processes, which can interfere with it.

Only an isolated reference is cached for the partition (`ops/probe-reference/<partition>.json`,
orchestrator side, written once (If-None-Match), replaced when a fresh isolated one disagrees): a job
could shape an in-job one, and a cached wrong reference would convict every later suspect of the
partition. An in-job reference serves the try that computed it, never a later one; a cached entry without
the isolation mark is never read.

The diagnosis compares the suspect node's probe fingerprint with it. It is only valid for the same
software and CPU level (`ProbeResult.env`: torch, CPU capability, threads): a reference from another
environment makes no verdict.

A reference read back (cached, or recorded by an earlier try of the incident) is hostile input like any
other record (docs/architecture.md): it is used only when it reads as a reference (`checked_reference`):
the probe's own JSON of a run without `--expect` (verdict `no-reference`), a 16-digit lower-case hex
fingerprint, the whole environment, and a node other than the suspect; and was computed in isolation
(`trusted_reference`). A pass is recorded only when the suspect's own probe gave the same fingerprint in
the same environment (`confirms`): a reference that does not fit the node's run gives `error`, never
`pass`. And a verdict is final only against a reference computed in isolation by this try (`decides`):
against a read-back one (stale, or computed on a node that has gone bad since) or an in-job one, a pass
or a fail that rests on the probe is unconfirmed until the node's probe is compared with a fresh isolated
reference (`judge_fresh`).
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

#: How a reference was computed (`computed.how`): by the orchestrator in a job of its own, outside the
#: suspect's job, or as a step of a running job.
ISOLATED = "isolated"
IN_JOB = "in_job"
#: The field of a reference that says how it was computed; only the orchestrator writes it.
COMPUTED = "computed"
#: Where the reference a diagnosis used came from (the diagnosis' `reference_from`): computed now in
#: isolation, recorded by an earlier try, the partition's cache, computed now as a step of a running job.
IDLE_NODE = "idle_node"
RECORDED = "recorded"
CACHED = "cached"
RUNNING_JOB = "running_job"


class NoReference(SlurmCommandError):
    """The reference probe ran and gave no fingerprint; the message says what it printed."""


class UnusableReference(ValueError):
    """A fresh reference run gave something that does not read as a reference of its kind; the message
    says what."""


def isolated_mark(node: str, reservation: str) -> dict[str, Any]:
    """How a reference computed in isolation was: on `node`, by a job of its own in MAINT reservation
    `reservation`."""
    return {"how": ISOLATED, "node": node, "reservation": reservation}


def in_job_mark(node: str, job_id: int) -> dict[str, Any]:
    """How a reference computed inside a running job was: on `node`, as a step of job `job_id`."""
    return {"how": IN_JOB, "node": node, "job_id": job_id}


def how_computed(ref: Any) -> str | None:
    """ISOLATED or IN_JOB, as the reference's `computed` mark says; None when it has none, or one that does
    not read (another node than the reference's own, a field of the wrong type)."""
    mark = ref.get(COMPUTED) if isinstance(ref, Mapping) else None
    if not isinstance(mark, Mapping) or mark.get("node") != ref.get("node"):
        return None
    how, job, reservation = mark.get("how"), mark.get("job_id"), mark.get("reservation")
    if how == ISOLATED and isinstance(reservation, str) and reservation:
        return ISOLATED
    if how == IN_JOB and isinstance(job, int) and not isinstance(job, bool):
        return IN_JOB
    return None


def run_reference(
    run: Callable[[tuple[str, ...]], CommandResult],
    *,
    computed: Mapping[str, Any],
    python: str | None = None,
    state_dir: str | None = None,
) -> dict[str, Any]:
    """The probe's JSON verdict (with `fingerprint`) on the healthy node `computed["node"]`, stamped with
    `computed` (isolated_mark or in_job_mark: how `run` runs the probe's argv there). NoReference when
    the probe gives no fingerprint; what `run` raises passes through."""
    node = str(computed["node"])
    argv: tuple[str, ...] = (python or sys.executable, "-m", "training.probe", "--node", node)
    if state_dir:
        argv += ("--state-dir", v.path("state_dir", state_dir))
    result = run(argv)
    obj = node_check.last_json_line(result.stdout)
    if result.exit_code != 0 or not obj or not obj.get("fingerprint"):
        where = (
            f"step of job {computed.get('job_id')}"
            if computed.get("how") == IN_JOB
            else f"reservation {computed.get('reservation')}"
        )
        raise NoReference(
            f"the reference probe on {node} ({where}) gave no fingerprint (rc {result.exit_code}): "
            f"{json.dumps(obj) if obj else result.stdout[-500:]} {result.stderr[-500:]}"
        )
    return {**obj, COMPUTED: dict(computed)}  # ours: what the probe printed under that name is replaced


def _reference_key(partition: str) -> str:
    return f"ops/probe-reference/{partition}.json"


def checked_reference(obj: Any, *, suspect: str | None = None) -> ProbeResult | None:
    """`obj` as a usable reference by its form (how it was computed is `how_computed`'s business), or None
    (why does not matter to the caller: it is never used)."""
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


def trusted_reference(obj: Any, *, suspect: str | None = None) -> ProbeResult | None:
    """`obj` as a reference that may be read back (recorded by an earlier try, or cached): it reads as one
    (`checked_reference`) and was computed in isolation. None otherwise: never used."""
    ref = checked_reference(obj, suspect=suspect)
    return ref if ref is not None and how_computed(obj) == ISOLATED else None


def cached_reference(
    store: ObjectStore, partition: str, *, suspect: str | None = None
) -> dict[str, Any] | None:
    """A known-good probe result from an earlier incident in this partition (nodes of one kind) that
    passes `trusted_reference`, or None."""
    try:
        obj = json.loads(store.get_bytes(_reference_key(partition)))
    except (StoreError, ValueError):
        return None
    return dict(obj) if trusted_reference(obj, suspect=suspect) is not None else None


def reference_of(rec: IncidentRecord) -> ProbeResult | None:
    """The reference an earlier try of this incident recorded (event `reference`, field `reference`), or
    None."""
    return rec.reference or None


def remember_reference(store: ObjectStore, partition: str, ref: Mapping[str, Any]) -> None:
    """Cache a freshly computed isolated reference; anything else (an in-job reference, one that does not
    read) is never cached. Written once; a cached object that is not trusted (garbled, not a reference,
    without the isolation mark) or disagrees with this fresh one (fingerprint or environment) is replaced,
    conditionally on its version, so that a bad entry cannot stay for good."""
    if trusted_reference(dict(ref)) is None:
        return  # never cache what would not be read back
    key = _reference_key(partition)
    if create_once(store, key, dump_json(dict(ref))):
        return
    # One is there already (ours, or a concurrent incident's: equal by construction, unless bad).

    def replace_unless_same(data: bytes) -> dict[str, Any] | None:
        try:
            old = trusted_reference(json.loads(data))
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


def choose_reference(
    store: ObjectStore,
    partition: str,
    *,
    suspect: str,
    recorded: ProbeResult | None,
    isolated: Callable[[], Mapping[str, Any] | None] | None = None,
    in_job: Callable[[], Mapping[str, Any] | None] | None = None,
) -> tuple[dict[str, Any], str] | None:
    """The reference to diagnose `suspect` with and where it came from (IDLE_NODE, RECORDED, CACHED,
    RUNNING_JOB); None when none is to be had. The one place that decides between a stored and a fresh
    reference, and what is cached. Each caller passes its own ways of computing one now: `isolated()` (in
    isolation; None when it cannot, e.g. no healthy idle node) and `in_job()` (as a step of a running
    job; None when there is no such job).

    In order: a fresh isolated reference, which is cached; the one this incident recorded, then the
    partition's cached one, each only when computed in isolation (`trusted_reference`); a fresh in-job
    one, never cached. The fresh isolated one comes first because it is the only kind a verdict is final
    against (`decides`): taking it first costs no more probe runs than confirming a verdict later, and the
    others serve only when no node is free for it. UnusableReference when a fresh run gave no reference of
    its kind; what the callables raise passes through."""
    if isolated is not None and (fresh := isolated()) is not None:
        if trusted_reference(dict(fresh), suspect=suspect) is None:
            raise UnusableReference(
                f"the isolated reference run gave no usable reference: {str(fresh)[:300]}"
            )
        remember_reference(store, partition, fresh)
        return dict(fresh), IDLE_NODE
    if recorded is not None and trusted_reference(recorded.to_json(), suspect=suspect) is not None:
        return recorded.to_json(), RECORDED
    if (cached := cached_reference(store, partition, suspect=suspect)) is not None:
        return cached, CACHED
    if in_job is not None and (fresh := in_job()) is not None:
        if checked_reference(dict(fresh), suspect=suspect) is None or how_computed(fresh) != IN_JOB:
            raise UnusableReference(f"the in-job reference run gave no usable reference: {str(fresh)[:300]}")
        return dict(fresh), RUNNING_JOB
    return None


def decides(source: str) -> bool:
    """Is a pass or a fail against a reference from `source` final? Only against one computed in
    isolation by this try (IDLE_NODE): a read-back one may be stale, an in-job one may be the job's."""
    return source == IDLE_NODE


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


def judge_fresh(
    probe: ProbeResult | None, fresh: ProbeResult, *, compared: ProbeResult | None = None
) -> tuple[str, str]:
    """The verdict (pass, fail or error) and a note on a node whose probe `probe` was first compared with a
    reference that does not decide alone (`compared`), against `fresh`, computed in isolation just now:
    pass on a match, fail on another fingerprint in the same environment, else error (not comparable).
    The note says whether the first reference was wrong."""
    wrong = compared is not None and compared.fingerprint != fresh.fingerprint
    tail = (
        f"; the stored one ({compared.fingerprint} on {compared.node}) was wrong"
        if compared and wrong
        else ""
    )
    if confirms(fresh, probe):
        return "pass", f"; confirmed by a fresh isolated reference on {fresh.node}{tail}"
    if probe is not None and probe.fingerprint and probe.env == fresh.env:
        return "fail", f"; a fresh isolated reference on {fresh.node} is {fresh.fingerprint}{tail}"
    return "error", f"; the fresh isolated reference on {fresh.node} is not comparable"
