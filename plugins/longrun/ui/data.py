"""One run's read model (`longrun.runview`) flattened into a `RunHealth`, the run-health page's only data.

Reads only: the page never writes. A record that does not parse is listed in `problems` and skipped (the
read model does that), so one bad object never hides the rest of a run. Node states come from a callable
(the Slurm client's `nodes`), so this module needs neither Slurm nor Airflow.

What it reads does not grow with the run's age (beyond the checkpoint list and the incidents): check
records only for the newest RECENT_CHECK_STEPS steps (`RunView.recent_checks`), every alert.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from longrun.runview import RECENT_CHECK_STEPS, RunView
from longrun.ui.model import CheckEvent, CheckpointView, IncidentView, NodeView, RunHealth
from training.records import schema
from training.records.alert import Alert
from training.records.job import CheckRecord
from training.records.orchestrator import Incident
from training.store.interface import ObjectStore

NodeSource = Callable[[], Sequence[Any]]
"""Returns objects shaped like `longrun.slurm.models.NodeState` (name, state, flags, reason)."""


def load_run_health(
    store: ObjectStore,
    run: str,
    *,
    nodes: NodeSource | None = None,
    now: float | None = None,
) -> RunHealth:
    """Everything the page shows about `run`. `nodes`: the Slurm node source (None: not shown)."""
    now = time.time() if now is None else now
    view = RunView(store, run)
    latest, report, checks = view.progress, view.report, view.recent_checks(RECENT_CHECK_STEPS)

    events = [_check_event(c) for c in checks] + [_alert_event(a) for _key, a in view.alerts]
    events.sort(key=lambda e: (e.step, e.verdict == "alert", e.check))

    loss: dict[int, float] = {}
    step_time: dict[int, float] = {}
    for step, value in [
        *((m.step, m.loss) for m in view.manifests.values()),
        *((c.step, c.loss) for c in checks),
        *((p.step, p.loss) for p in view.progress_history),
    ]:
        if value is not None:
            loss[step] = value
    for p in view.progress_history:
        step_time[p.step] = p.step_time_s

    node_views, nodes_error = _nodes(nodes, run)
    incidents = _incidents(view)
    return RunHealth(
        run=run,
        # The report is written after the last heartbeat the store saw (heartbeats are throttled).
        step=max([p.step for p in [latest] if p] + [r.final_step for r in [report] if r], default=None),
        total_steps=(latest.total_steps if latest else None) or (report.total_steps if report else None),
        loss=latest.loss if latest else None,
        step_time_s=latest.step_time_s if latest else None,
        heartbeat_age_s=max(0.0, now - latest.time) if latest else None,
        finished=report is not None,
        final_fingerprint=report.final_fingerprint if report else None,
        loss_series=tuple(sorted(loss.items())),
        step_time_series=tuple(sorted(step_time.items())),
        checks=tuple(events),
        checks_window=RECENT_CHECK_STEPS,
        votes=view.votes(checks),
        checkpoints=tuple(
            CheckpointView(
                step=c.step,
                state=c.state,
                time=c.manifest.time,
                validation_errors=c.validation_errors,
                current=c.current,
            )
            for c in view.checkpoints()
        ),
        incidents=incidents,
        nodes=node_views,
        nodes_error=nodes_error,
        problems=tuple(view.problems),
    )


# ---- pieces -----------------------------------------------------------------------------------------


def _check_event(c: CheckRecord) -> CheckEvent:
    return CheckEvent(
        step=c.step,
        check=c.check,
        verdict=c.verdict,
        duration_s=c.duration_s,
        suspect_ranks=c.suspect_ranks,
        suspect_nodes=c.suspect_nodes,
        evidence=dict(c.evidence),
    )


def _alert_event(a: Alert) -> CheckEvent:
    return CheckEvent(
        step=a.step,
        check=a.check,
        verdict="alert",
        suspect_ranks=a.suspect_ranks,
        suspect_nodes=a.suspect_nodes,
        evidence=dict(a.evidence),
    )


def _incidents(view: RunView) -> tuple[IncidentView, ...]:
    keys = view.keys("incidents/")
    out = []
    for _key, inc in view.incidents:
        alert = inc.alert_ref  # the incident's copy of its alert, read tolerantly
        out.append(
            IncidentView(
                incident_id=inc.incident_id,
                mode=inc.mode,
                step=alert.step,
                check=alert.check,
                suspect_nodes=alert.suspect_nodes,
                status=inc.status,
                verdict=inc.diagnosis.verdict or inc.old_verdict,
                timeline=tuple(e.to_json() for e in inc.timeline),
                runbooks=_runbook_names(inc),
                restart_step=inc.checkpoint.step,
                facts=_incident_facts(inc),
                plots=tuple(
                    k for k in keys if k.startswith(f"incidents/{inc.incident_id}/") and k.endswith(".png")
                ),
                record=inc.to_json(),
            )
        )
    return tuple(out)


def _runbook_names(inc: Incident) -> tuple[str, ...]:
    """'runbooks/recompute-mismatch.md' -> 'recompute-mismatch' (records carry repository paths)."""
    single = inc.old_runbook
    paths = [single, *inc.runbooks] if single is not None else list(inc.runbooks)
    names: list[str] = []
    for p in paths:
        name = str(p).rsplit("/", 1)[-1].removesuffix(".md")
        if name and name not in names:
            names.append(name)
    return tuple(names)


def _incident_facts(inc: Incident) -> tuple[tuple[str, str], ...]:
    facts: list[tuple[str, str]] = []

    def add(label: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            facts.append((label, str(value)))

    att = inc.attribution
    add("attribution", " ".join(str(x) for x in (att.verdict, att.node, att.reason) if x))
    add(
        "drain",
        " ".join(
            f"{k}={v}" for k, v in sorted(inc.drain.to_json().items()) if not isinstance(v, dict | list)
        ),
    )
    diag = inc.diagnosis
    add("diagnosis", " - ".join(str(x) for x in (diag.verdict, diag.summary) if x))
    ck = inc.checkpoint
    add("restart checkpoint", " ".join(str(x) for x in (ck.step, ck.why and f"({ck.why})") if x))
    add("lost steps", inc.lost_steps)
    rl = inc.relaunch
    shown = {"exclude": rl.exclude, "job_id": rl.job_id, "nodes": rl.nodes}  # sorted by name
    add(
        "relaunch",
        " ".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in shown.items() if v is not None),
    )
    ttr = inc.time_to_recover_s
    add("alert to running again", f"{ttr:.1f} s" if ttr is not None else None)
    return tuple(facts)


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
