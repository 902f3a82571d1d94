"""HTML for the run-health pages: pure functions of a `RunHealth`, every value escaped.

Plain HTML with one small stylesheet and no scripts beyond a timed reload, so the page works inside the
Airflow UI's iframe and offline (no CDN).
"""

from __future__ import annotations

import json
import time
from html import escape
from typing import Any

from longrun.ui.model import CheckEvent, IncidentView, RunHealth
from training.records.orchestrator import TimelineEvent

REFRESH_S = 15

_CSS = """
body{font-family:system-ui,sans-serif;margin:1rem 1.5rem;color:#222;background:#fff}
h1{font-size:1.4rem;margin:.2rem 0}h2{font-size:1.1rem;margin:1.4rem 0 .4rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85rem}td,th{border:1px solid #ddd;padding:.2rem .5rem;text-align:left}
th{background:#f4f4f4}.tiles{display:flex;flex-wrap:wrap;gap:.6rem}
.tile{border:1px solid #ddd;border-radius:6px;padding:.4rem .8rem;min-width:8rem}
.tile b{display:block;font-size:1.2rem}.ok{color:#1a7f37}.bad{color:#c62828;font-weight:600}
.warn{color:#b26a00}.muted{color:#777}.badge{border-radius:4px;padding:0 .4rem;font-size:.8rem}
.b-pass,.b-promoted,.b-validated{background:#dcf5e3}.b-fail,.b-alert,.b-suspect,.b-invalid{background:#fde2e1}
.b-skip,.b-saved{background:#eee}img{max-width:100%;border:1px solid #eee}
details{margin:.3rem 0}pre{background:#f7f7f7;padding:.5rem;overflow:auto;font-size:.8rem}
.bar{height:10px;background:#eee;border-radius:5px;width:20rem}.bar>div{height:10px;background:#2ca02c;border-radius:5px}
"""


def page_html(title: str, body: str, *, refresh: bool = False) -> str:
    """A whole page around `body` (every page of the UI shares its style); it reloads itself every
    REFRESH_S seconds when `refresh`, so a running run's page stays current."""
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{meta}'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>"
    )


def _fmt_time(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _fmt_age(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago"


def _badge(text: str) -> str:
    return f'<span class="badge b-{escape(text)}">{escape(text)}</span>'


def index_html(runs: list[str], *, base: str, store: str) -> str:
    items = "".join(f'<li><a href="{escape(base)}/runs/{escape(r)}">{escape(r)}</a></li>' for r in runs)
    body = f"<h1>longrun: runs</h1><p class='muted'>store: {escape(store)}</p>" + (
        f"<ul>{items}</ul>" if runs else "<p>No runs in the store yet.</p>"
    )
    return page_html("longrun runs", body)


def run_html(h: RunHealth, *, base: str, store: str, stale_after_s: float = 120.0) -> str:
    """The run-health page. `base`: the app's URL prefix (links and images are absolute under it)."""
    run_url = f"{base}/runs/{escape(h.run)}"
    parts = [
        f"<h1>Run health: {escape(h.run)}</h1>",
        f"<p class='muted'>store: {escape(store)} &middot; reloads every {REFRESH_S} s &middot; "
        f"<a href='{run_url}/health.json'>JSON</a> &middot; <a href='{escape(base)}/'>all runs</a></p>",
        _tiles(h, stale_after_s),
        "<h2>Loss and checks</h2>",
        _window_note(h),
        f'<img alt="loss over steps" src="{run_url}/loss.png">',
        f'<img alt="replica fingerprint agreement" src="{run_url}/fingerprints.png">',
        _alerts(h),
        _incidents(h, base=base, run_url=run_url),
        _checks(h),
        _checkpoints(h),
        _nodes(h, base=base),
    ]
    if h.problems:
        items = "".join(f"<li>{escape(p)}</li>" for p in h.problems)
        parts.append(f"<h2>Unreadable records</h2><ul class='warn'>{items}</ul>")
    return page_html(f"{h.run}: run health", "".join(parts), refresh=not h.finished)


def _tiles(h: RunHealth, stale_after_s: float) -> str:
    if h.finished:
        status, cls = "finished", "ok"
    elif any(i.status not in ("relaunched", "observed", "rejected") for i in h.incidents) or (
        h.alerts and not h.incidents
    ):
        status, cls = "incident", "bad"
    elif h.heartbeat_age_s is None:
        status, cls = "no heartbeat yet", "muted"
    elif h.heartbeat_age_s > stale_after_s:
        status, cls = "heartbeat stale", "warn"
    else:
        status, cls = "training", "ok"
    step = "-" if h.step is None else str(h.step)
    bar = ""
    if h.step is not None and h.total_steps:
        pct = max(0.0, min(100.0, 100.0 * h.step / h.total_steps))
        step += f" / {h.total_steps}"
        bar = f'<div class="bar" title="{pct:.0f}%"><div style="width:{pct:.1f}%"></div></div>'
    counts = h.check_counts()
    passes = sum(v.get("pass", 0) for v in counts.values())
    fails = sum(v.get("fail", 0) for v in counts.values())
    tiles = [
        ("status", f'<span class="{cls}" id="run-status">{escape(status)}</span>'),
        ("step", escape(step) + bar),
        ("loss", "-" if h.loss is None else f"{h.loss:.4g}"),
        ("step time", "-" if h.step_time_s is None else f"{h.step_time_s * 1000:.0f} ms"),
        ("heartbeat", _fmt_age(h.heartbeat_age_s)),
        (
            "checks",
            f"<span class='ok'>{passes} pass</span> / <span class='{'bad' if fails else 'muted'}'>"
            f"{fails} fail</span>"
            + (
                ""
                if h.checks_window is None
                else f" <span class='muted'>(last {h.checks_window} steps)</span>"
            ),
        ),
        ("alerts", f"<span class='{'bad' if h.alerts else 'ok'}'>{len(h.alerts)}</span>"),
        ("incidents", str(len(h.incidents))),
    ]
    if h.final_fingerprint:
        tiles.append(("final fingerprint", f"<code>{escape(h.final_fingerprint)}</code>"))
    return (
        '<div class="tiles">'
        + "".join(
            f'<div class="tile" id="tile-{escape(k.replace(" ", "-"))}"><span class="muted">{escape(k)}</span><b>{v}</b></div>'
            for k, v in tiles
        )
        + "</div>"
    )


def _evidence(ev: dict[str, Any]) -> str:
    if not ev:
        return ""
    return f"<details><summary>evidence</summary><pre>{escape(json.dumps(ev, indent=1, sort_keys=True))}</pre></details>"


def _alerts(h: RunHealth) -> str:
    if not h.alerts:
        return "<h2>Alerts</h2><p class='ok'>No SDC alerts.</p>"
    rows = "".join(
        f"<tr><td>{a.step}</td><td>{escape(a.check)}</td><td>{escape(', '.join(map(str, a.suspect_ranks)) or '-')}</td>"
        f"<td>{escape(', '.join(a.suspect_nodes) or '-')}</td><td>{_evidence(a.evidence)}</td></tr>"
        for a in h.alerts
    )
    return (
        "<h2>Alerts</h2><table id='alerts'><tr><th>step</th><th>check</th><th>suspect ranks</th>"
        f"<th>suspect nodes</th><th></th></tr>{rows}</table>"
    )


def _incidents(h: RunHealth, *, base: str, run_url: str) -> str:
    if not h.incidents:
        return "<h2>Incidents</h2><p class='muted'>None.</p>"
    out = ["<h2>Incidents</h2>"]
    for inc in h.incidents:
        runbook = (
            ", ".join(
                f"<a class='runbook' href='{escape(base)}/runbooks/{escape(b)}'>runbook: {escape(b)}</a>"
                for b in inc.runbooks
            )
            if inc.runbooks
            else "<span class='warn'>no runbook named in the record</span>"
        )
        facts = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in inc.facts)
        events = [TimelineEvent.shown(e) for e in inc.timeline]  # an entry that does not read still shows
        t0 = min((e.time for e in events if e.time is not None), default=None)
        ordered = sorted(events, key=lambda e: e.time if e.time is not None else float("inf"))
        rows = "".join(_timeline_row(e, t0) for e in ordered)
        plots = "".join(
            f'<a href="{run_url}/{escape(k)}"><img alt="{escape(k)}" style="max-width:30rem" src="{run_url}/{escape(k)}"></a>'
            for k in inc.plots
        )
        out.append(
            f"<div class='incident' id='incident-{escape(inc.incident_id)}'>"
            f"<h3>{escape(inc.incident_id)} {_badge('closed' if inc.status in _CLOSED else 'open')} "
            f"<span class='muted'>mode {escape(inc.mode)}, status "
            f"{escape(inc.status or '-')}</span></h3>"
            f"<p>alert: {escape(str(inc.check))} at step {inc.step}, suspect nodes "
            f"{', '.join(node_link(base, n) for n in inc.suspect_nodes) or '-'}; diagnosis: "
            f"<b>{escape(inc.verdict or 'pending')}</b>; {runbook}</p>"
            + _closing_note(h, inc)
            + (f"<table class='facts'>{facts}</table>" if facts else "")
            + f"<p>Timeline:</p><table class='timeline'><tr><th>time</th><th>+s</th><th>event</th><th>details</th></tr>"
            f"{rows}</table>{plots}"
            f"<details><summary>record</summary><pre>{escape(json.dumps(inc.record, indent=1, sort_keys=True))}</pre></details>"
            "</div>"
        )
    return "".join(out)


#: checkpoint_audit's default `healthy_steps` (longrun.incident.closing.HEALTHY_STEPS; a test pins the two
#: together: the page sits beside `incident` in the layers and does not import it).
HEALTHY_STEPS_DEFAULT = 20


def _closing_note(h: RunHealth, inc: IncidentView) -> str:
    """When an open incident closes, and what it waits for: an operator reading "open" after the relaunched
    run finished must not have to guess whether something is stuck."""
    if inc.status in _CLOSED:
        return ""
    by_hand = (
        f"<code>longrun incidents close --run {escape(h.run)} --incident {escape(inc.incident_id)}"
        " --reason TEXT</code>"
    )
    if inc.status == "relaunched":
        if h.step is not None and inc.restart_step is not None:
            progress = f"now {max(h.step - inc.restart_step, 0)} steps past its resume point (step {inc.restart_step})"
        else:
            progress = "no progress heartbeat read since the relaunch"
        finished = "The relaunched run has finished. " if h.finished else ""
        text = (
            f"{finished}Open until the relaunched run has trained <code>healthy_steps</code> steps past its"
            f" resume point with no new alert ({progress}; <code>healthy_steps</code> is the Variable"
            f" <code>longrun_healthy_steps</code>, {HEALTHY_STEPS_DEFAULT} unless set). The daily"
            " <code>checkpoint_audit</code> (00:00 UTC) then closes it; trigger <code>checkpoint_audit</code>"
            f" to close it now, or close it by hand: {by_hand}."
        )
    elif inc.status == "observed":
        text = f"Observe mode acted on nothing: it stays open until a person closes it: {by_hand}."
    elif inc.status == "ambiguous":
        text = f"The evidence named no single node, so nothing was drained: it stays open until a person closes it: {by_hand}."
    elif inc.status == "failed":
        text = f"A step of the incident failed (the runbook says what to do): it stays open until a person closes it: {by_hand}."
    else:
        text = "In progress: the incident's steps are running (DAG <code>sdc_incident</code>); it can close only after its relaunch."
    return f"<p class='muted incident-closing'>{text}</p>"


def _timeline_row(e: TimelineEvent, t0: float | None) -> str:
    t = e.time
    rel = f"{t - t0:+.1f}" if t is not None and t0 is not None else ""
    when = _fmt_time(t) if t is not None else "-"
    details = escape(json.dumps(dict(e.details), sort_keys=True)) if e.details else ""
    return f"<tr><td>{when}</td><td>{rel}</td><td>{escape(e.event)}</td><td><code>{details}</code></td></tr>"


def _window_note(h: RunHealth) -> str:
    if h.checks_window is None:
        return ""
    return (
        f"<p class='muted' id='checks-window'>Checks and votes: the newest {h.checks_window} steps "
        "(every alert, whenever it was raised). Older ones: <code>longrun records list --run RUN --kind checks</code>.</p>"
    )


def _checks(h: RunHealth) -> str:
    counts = h.check_counts()
    summary = "".join(
        f"<tr><td>{escape(c)}</td>"
        + "".join(f"<td>{v.get(k, 0)}</td>" for k in ("pass", "fail", "skip", "alert"))
        + "</tr>"
        for c, v in sorted(counts.items())
    )
    recent: list[CheckEvent] = [c for c in h.checks if c.verdict != "pass"] + [
        c for c in h.checks if c.verdict == "pass"
    ][-30:]
    recent.sort(key=lambda c: (c.step, c.check))
    rows = "".join(
        f"<tr><td>{c.step}</td><td>{escape(c.check)}</td><td>{_badge(c.verdict)}</td>"
        f"<td>{'-' if c.duration_s is None else f'{c.duration_s * 1000:.1f} ms'}</td>"
        f"<td>{escape(', '.join(c.suspect_nodes) or '')}</td><td>{_evidence(c.evidence) if c.verdict != 'pass' else ''}</td></tr>"
        for c in recent
    )
    return "<h2>Check timeline</h2>" + (
        "<table><tr><th>check</th><th>pass</th><th>fail</th><th>skip</th><th>alert</th></tr>"
        f"{summary}</table><p class='muted'>Every failure and alert, and the last 30 passes:</p>"
        f"<table id='checks'><tr><th>step</th><th>check</th><th>verdict</th><th>time</th><th>nodes</th><th></th></tr>{rows}</table>"
        if h.checks
        else "<p class='muted'>No check records yet.</p>"
    )


def _checkpoints(h: RunHealth) -> str:
    if not h.checkpoints:
        return "<h2>Checkpoints</h2><p class='muted'>None yet.</p>"
    rows = "".join(
        f"<tr><td>{c.step}</td><td>{_badge(c.state)}{' (current)' if c.current else ''}</td>"
        f"<td>{_fmt_time(c.time)}</td><td>{escape('; '.join(c.validation_errors))}</td></tr>"
        for c in h.checkpoints
    )
    return (
        "<h2>Checkpoints</h2><table id='checkpoints'><tr><th>step</th><th>state</th><th>saved</th>"
        f"<th>validation errors</th></tr>{rows}</table>"
    )


#: Incident statuses shown as closed (as retention counts them).
_CLOSED = ("closed", "resolved", "rejected")


def node_link(base: str, node: str) -> str:
    """A node's name, linked to its history page."""
    return f"<a class='node' href='{escape(base)}/nodes/{escape(node)}'>{escape(node)}</a>"


def _nodes(h: RunHealth, *, base: str = "") -> str:
    if h.nodes_error:
        return f"<h2>Slurm nodes</h2><p class='warn'>{escape(h.nodes_error)}</p>"
    rows = "".join(
        f"<tr><td>{node_link(base, n.name)}</td><td class='{node_class(n.state)}'>"
        f"{escape(n.state)}</td><td>{escape(n.reason or '')}</td>"
        f"<td>{'this run' if n.this_run else ('longrun' if n.ours else '')}</td></tr>"
        for n in h.nodes
    )
    return (
        "<h2>Slurm nodes</h2><table id='nodes'><tr><th>node</th><th>state</th><th>reason</th>"
        f"<th>drained by</th></tr>{rows}</table>"
    )


def message_html(title: str, text: str, *, base: str) -> str:
    return page_html(
        title, f"<h1>{escape(title)}</h1><p>{escape(text)}</p><p><a href='{escape(base)}/'>all runs</a></p>"
    )


def node_class(state: str) -> str:
    """Red: takes no jobs (drained, down, not responding); amber: held for maintenance; green otherwise."""
    if any(x in state for x in ("DRAIN", "down", "NOT_RESPONDING", "drain")):
        return "bad"
    if any(x in state for x in ("MAINTENANCE", "RESERVED")):
        return "warn"
    return "ok"


def runbook_html(name: str, markdown_text: str, *, base: str) -> str:
    try:
        from markdown_it import MarkdownIt

        # html=False: the runbook's text is shown, never executed as markup.
        body = MarkdownIt("commonmark", {"html": False}).render(markdown_text)
    except ImportError:
        body = f"<pre>{escape(markdown_text)}</pre>"
    return page_html(f"runbook {name}", f"<p><a href='{escape(base)}/'>longrun</a></p>{body}")
