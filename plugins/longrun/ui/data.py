"""Read one run's records from the store into a `RunHealth` (the run-health page's only data source).

Reads only: the page never writes. A record that does not parse is listed in `problems` and skipped, so
one bad object never hides the rest of a run. Node states come from a callable (the Slurm client's
`nodes`), so this module needs neither Slurm nor Airflow.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from longrun.ui.model import (
    CheckEvent,
    CheckpointView,
    IncidentView,
    NodeView,
    RunHealth,
    VotePoint,
)
from training import schema
from training.store import NotFound, ObjectStore, StoreError

NodeSource = Callable[[], Sequence[Any]]
"""Returns objects shaped like `longrun.slurm.client.NodeState` (name, state, flags, reason)."""


class _Reader:
    """Store access for one run that records, instead of raising, what it could not read."""

    def __init__(self, store: ObjectStore, run: str) -> None:
        self.store, self.run = store, run
        self.prefix = schema.run_prefix(run)
        self.problems: list[str] = []

    def keys(self, relative_prefix: str) -> list[str]:
        """Relative keys under `relative_prefix`, sorted."""
        try:
            infos = list(self.store.list(self.prefix + relative_prefix))
        except StoreError as e:
            self.problems.append(f"{relative_prefix}: cannot list ({e})")
            return []
        return sorted(i.key[len(self.prefix) :] for i in infos)

    def text(self, relative: str) -> str | None:
        try:
            return self.store.get_bytes(self.prefix + relative).decode()
        except NotFound:
            return None
        except (StoreError, UnicodeDecodeError) as e:
            self.problems.append(f"{relative}: cannot read ({e})")
            return None

    def record(self, relative: str, kind: str) -> dict[str, Any] | None:
        body = self.text(relative)
        if body is None:
            return None
        return self._parse(relative, body, kind)

    def records(self, relative: str, kind: str) -> list[dict[str, Any]]:
        """Every record of a JSON-lines object."""
        body = self.text(relative)
        if body is None:
            return []
        out = []
        for n, line in enumerate(body.splitlines(), 1):
            if line.strip():
                rec = self._parse(f"{relative}:{n}", line, kind)
                if rec is not None:
                    out.append(rec)
        return out

    def _parse(self, where: str, body: str, kind: str) -> dict[str, Any] | None:
        try:
            obj = json.loads(body)
            schema.validate(kind, obj)
        except (ValueError, schema.SchemaError) as e:
            self.problems.append(f"{where}: not a {kind} record ({e})")
            return None
        return dict(obj)


def list_runs(store: ObjectStore) -> list[str]:
    """Run names that have at least one object in the store, sorted."""
    runs = set()
    for info in store.list("runs/"):
        parts = info.key.split("/")
        if len(parts) > 2 and parts[1]:
            runs.add(parts[1])
    return sorted(runs)


def load_run_health(
    store: ObjectStore,
    run: str,
    *,
    nodes: NodeSource | None = None,
    now: float | None = None,
) -> RunHealth:
    """Everything the page shows about `run`. `nodes`: the Slurm node source (None: not shown)."""
    schema.check_run_name(run)
    now = time.time() if now is None else now
    r = _Reader(store, run)

    progress = [
        rec
        for key in r.keys("progress/")
        for rec in (r.records(key, "progress") if key.endswith(".jsonl") else [r.record(key, "progress")])
        if rec is not None
    ]
    latest = r.record(schema.PROGRESS_PATH, "progress")
    report = r.record(schema.REPORT_PATH, "report")
    check_recs = _dedup_checks(rec for key in r.keys("checks/") for rec in r.records(key, "check"))
    alerts = [a for key in r.keys("alerts/") if key.endswith(".json") for a in [r.record(key, "alert")] if a]
    manifests = {
        m["step"]: m
        for key in r.keys("checkpoints/")
        if schema.step_of_manifest_key(key) is not None
        for m in [r.record(key, "manifest")]
        if m
    }
    world = _int_or_none((latest or {}).get("world_size")) or _world_size(manifests.values(), alerts)

    events = [_check_event(c) for c in check_recs] + [_alert_event(a) for a in alerts]
    events.sort(key=lambda e: (e.step, e.verdict == "alert", e.check))

    loss: dict[int, float] = {}
    step_time: dict[int, float] = {}
    for rec in [*manifests.values(), *check_recs, *progress]:
        if isinstance(rec.get("loss"), int | float) and not isinstance(rec.get("loss"), bool):
            loss[rec["step"]] = float(rec["loss"])
        if isinstance(rec.get("step_time_s"), int | float) and rec.get("kind") == "progress":
            step_time[rec["step"]] = float(rec["step_time_s"])

    node_views, nodes_error = _nodes(nodes, run)
    return RunHealth(
        run=run,
        # The report is written after the last heartbeat the store saw (heartbeats are throttled).
        step=max([r["step"] for r in [latest] if r] + [r["final_step"] for r in [report] if r], default=None),
        total_steps=_int_or_none((latest or {}).get("total_steps") or (report or {}).get("total_steps")),
        loss=(latest or {}).get("loss"),
        step_time_s=(latest or {}).get("step_time_s"),
        heartbeat_age_s=max(0.0, now - latest["time"]) if latest else None,
        finished=report is not None,
        final_fingerprint=(report or {}).get("final_fingerprint"),
        loss_series=tuple(sorted(loss.items())),
        step_time_series=tuple(sorted(step_time.items())),
        checks=tuple(events),
        votes=tuple(
            v for c in check_recs if c["check"] == "weight_vote" for v in [_vote(c, world)] if v is not None
        ),
        checkpoints=_checkpoints(r, manifests),
        incidents=_incidents(r),
        nodes=node_views,
        nodes_error=nodes_error,
        problems=tuple(r.problems),
    )


# ---- pieces -----------------------------------------------------------------------------------------


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _dedup_checks(recs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A batch may be written again (a retried flush): keep one record per (step, check, rank)."""
    seen: dict[tuple[int, str, int], dict[str, Any]] = {}
    for rec in recs:
        seen[(rec["step"], rec["check"], rec["rank"])] = rec
    return sorted(seen.values(), key=lambda c: (c["step"], c["check"]))


def _check_event(c: dict[str, Any]) -> CheckEvent:
    return CheckEvent(
        step=c["step"],
        check=c["check"],
        verdict=c["verdict"],
        duration_s=float(c["duration_s"]),
        suspect_ranks=tuple(c.get("suspect_ranks") or ()),
        suspect_nodes=tuple(c.get("suspect_nodes") or ()),
        evidence=dict(c.get("evidence") or {}),
    )


def _alert_event(a: dict[str, Any]) -> CheckEvent:
    return CheckEvent(
        step=a["step"],
        check=a["check"],
        verdict="alert",
        suspect_ranks=tuple(a["suspect_ranks"]),
        suspect_nodes=tuple(a["suspect_nodes"]),
        evidence=dict(a["evidence"]),
    )


def _world_size(manifests: Iterable[dict[str, Any]], alerts: Iterable[dict[str, Any]]) -> int | None:
    """The number of replicas, from whichever record says (manifests carry the world)."""
    for m in manifests:
        for field in ("size", "world_size", "ranks"):
            v = m["world"].get(field)
            if isinstance(v, int) and v > 0:
                return v
            if isinstance(v, list) and v:
                return len(v)
    for a in alerts:
        by_rank = a["evidence"].get("fingerprints_by_rank")
        if isinstance(by_rank, dict) and by_rank:
            return len(by_rank)
    return None


def _vote(c: dict[str, Any], world: int | None) -> VotePoint | None:
    """Agreement at one weight vote: exact when the record lists every replica's fingerprint (failures
    do); a pass means every replica agreed."""
    ev = c.get("evidence") or {}
    by_rank = ev.get("fingerprints_by_rank")
    if isinstance(by_rank, dict) and by_rank:
        counts = Counter(by_rank.values())
        top, n = counts.most_common(1)[0]
        if 2 * n <= len(by_rank):  # no strict majority: nobody "agrees"
            return VotePoint(step=c["step"], agreeing=0, replicas=len(by_rank), dissenters=())
        dissent = tuple(sorted(int(r) for r, v in by_rank.items() if v != top))
        return VotePoint(step=c["step"], agreeing=n, replicas=len(by_rank), dissenters=dissent)
    replicas = _int_or_none(ev.get("replicas")) or world or 1
    if c["verdict"] == "pass":
        return VotePoint(step=c["step"], agreeing=replicas, replicas=replicas)
    if c["verdict"] == "fail":
        dissent = tuple(c.get("suspect_ranks") or ())
        return VotePoint(
            step=c["step"],
            agreeing=max(0, replicas - len(dissent)),
            replicas=max(replicas, len(dissent)),
            dissenters=dissent,
        )
    return None


def _checkpoints(r: _Reader, manifests: dict[int, dict[str, Any]]) -> tuple[CheckpointView, ...]:
    validations: dict[int, list[dict[str, Any]]] = {}
    for key in r.keys("validations/"):
        v = r.record(key, "validation")
        if v:
            validations.setdefault(v["step"], []).append(v)
    promoted = {p["step"] for key in r.keys("promoted/history/") for p in [r.record(key, "promotion")] if p}
    pointer = r.text(schema.PROMOTED_POINTER_PATH)
    current = None
    if pointer is not None:
        try:
            current = int(json.loads(pointer)["step"])
            promoted.add(current)
        except (ValueError, KeyError, TypeError) as e:
            r.problems.append(f"{schema.PROMOTED_POINTER_PATH}: no step ({e})")
    suspects = [s for key in r.keys("suspect/") for s in [r.record(key, "suspect")] if s]

    out = []
    for step in sorted(manifests):
        m = manifests[step]
        vs = sorted(validations.get(step, []), key=lambda v: v["time"])
        state, errors = "saved", tuple[str, ...]()
        if vs:
            state = "validated" if vs[-1]["ok"] else "invalid"
            errors = () if vs[-1]["ok"] else tuple(str(e) for e in vs[-1]["errors"])
        if step in promoted:
            state = "promoted"
        if any(_is_suspect(step, m, s) for s in suspects):
            state = "suspect"
        out.append(
            CheckpointView(
                step=step, state=state, time=m["time"], validation_errors=errors, current=step == current
            )
        )
    return tuple(out)


def _dict(value: Any) -> dict[str, Any]:
    """A record field that should be an object; anything else reads as empty."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _is_suspect(step: int, manifest: dict[str, Any], s: dict[str, Any]) -> bool:
    """A suspect record demotes the checkpoints after its last known-good step that were saved before it
    (the relaunch saves later ones from a good state). An explicit `steps` list wins."""
    if isinstance(s.get("steps"), list):
        return step in s["steps"]
    return step > s["after_step"] and manifest["time"] <= s["time"]


def _incidents(r: _Reader) -> tuple[IncidentView, ...]:
    keys = r.keys("incidents/")
    out = []
    for key in keys:
        if key.count("/") != 1 or not key.endswith(".json"):
            continue
        rec = r.record(key, "incident")
        if rec is None:
            continue
        ident = rec["incident_id"]
        alert = rec["alert"]
        diagnosis = _dict(rec.get("diagnosis"))
        out.append(
            IncidentView(
                incident_id=ident,
                mode=rec["mode"],
                step=_int_or_none(alert.get("step")),
                check=alert.get("check"),
                suspect_nodes=tuple(alert.get("suspect_nodes") or ()),
                status=rec.get("status"),
                verdict=diagnosis.get("verdict") or rec.get("verdict"),
                timeline=tuple(e if isinstance(e, dict) else {"event": str(e)} for e in rec["timeline"]),
                runbooks=_runbook_names(rec),
                restart_step=_int_or_none(_dict(rec.get("checkpoint")).get("step")),
                facts=_incident_facts(rec),
                plots=tuple(k for k in keys if k.startswith(f"incidents/{ident}/") and k.endswith(".png")),
                record=rec,
            )
        )
    out.sort(key=lambda i: (_first_time(i.timeline), i.incident_id))
    return tuple(out)


def _runbook_names(rec: dict[str, Any]) -> tuple[str, ...]:
    """'runbooks/recompute-mismatch.md' -> 'recompute-mismatch' (records carry repository paths)."""
    paths = _list(rec.get("runbooks"))
    if isinstance(rec.get("runbook"), str):
        paths = [rec["runbook"], *paths]
    names: list[str] = []
    for p in paths:
        name = str(p).rsplit("/", 1)[-1].removesuffix(".md")
        if name and name not in names:
            names.append(name)
    return tuple(names)


def _incident_facts(rec: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    facts: list[tuple[str, str]] = []

    def add(label: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            facts.append((label, str(value)))

    att = _dict(rec.get("attribution"))
    add(
        "attribution", " ".join(str(x) for x in (att.get("verdict"), att.get("node"), att.get("reason")) if x)
    )
    drain = _dict(rec.get("drain"))
    add("drain", " ".join(f"{k}={v}" for k, v in sorted(drain.items()) if not isinstance(v, dict | list)))
    diag = _dict(rec.get("diagnosis"))
    add("diagnosis", " - ".join(str(x) for x in (diag.get("verdict"), diag.get("summary")) if x))
    ck = _dict(rec.get("checkpoint"))
    add(
        "restart checkpoint",
        " ".join(str(x) for x in (ck.get("step"), ck.get("why") and f"({ck['why']})") if x),
    )
    add("lost steps", rec.get("lost_steps"))
    rl = _dict(rec.get("relaunch"))
    add(
        "relaunch", " ".join(f"{k}={v}" for k, v in sorted(rl.items()) if k in ("job_id", "nodes", "exclude"))
    )
    ttr = rec.get("time_to_recover_s")
    add("alert to running again", f"{ttr:.1f} s" if isinstance(ttr, int | float) else None)
    return tuple(facts)


def _first_time(timeline: Sequence[dict[str, Any]]) -> float:
    times = [e["time"] for e in timeline if isinstance(e.get("time"), int | float)]
    return min(times) if times else 0.0


def _nodes(source: NodeSource | None, run: str) -> tuple[tuple[NodeView, ...], str | None]:
    if source is None:
        return (), "Slurm is not configured for this server (no SLURM_CONF)"
    try:
        states = list(source())
    except Exception as e:  # the page must render with Slurm down; the error is shown instead
        return (), f"Slurm did not answer: {type(e).__name__}: {e}"
    views = []
    for n in sorted(states, key=lambda n: n.name):
        flags = "+".join(sorted(n.flags))
        reason = n.reason or None
        views.append(
            NodeView(
                name=n.name,
                state=f"{n.state}+{flags}" if flags else n.state,
                reason=reason,
                ours=bool(reason and reason.startswith(schema.DRAIN_PREFIX)),
                this_run=bool(reason and reason.startswith(schema.DRAIN_PREFIX) and f":{run}:" in reason),
            )
        )
    return tuple(views), None
