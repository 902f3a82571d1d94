"""The node page: a node's history (timeline and standing) beside its live Slurm state.

Shows the same events, in the same order and with the same fields, as `longrun nodes show NODE`.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from longrun.health import history as h
from longrun.health.cli import timeline_line
from longrun.health.policy import Standing
from longrun.ui.page import node_class, node_link, page_html


def nodes_index_html(rows: list[tuple[str, str, int]], *, base: str) -> str:
    items = "".join(
        f"<tr><td>{node_link(base, n)}</td><td>{escape(state)}</td><td>{count}</td></tr>"
        for n, state, count in rows
    )
    body = f"<p><a href='{escape(base)}/'>longrun</a></p><h1>Nodes with a history</h1>" + (
        f"<table id='node-list'><tr><th>node</th><th>state (history)</th><th>events</th></tr>{items}</table>"
        if rows
        else "<p>No node history yet.</p>"
    )
    return page_html("longrun nodes", body)


def node_html(
    node: str,
    events: list[h.NodeEvent],
    standing: Standing,
    *,
    base: str,
    slurm: Any | None,
    error: str | None = None,
) -> str:
    flags = "+".join(sorted(getattr(slurm, "flags", ()) or ())) if slurm is not None else ""
    shown = f"{slurm.state}+{flags}" if slurm is not None and flags else getattr(slurm, "state", "")
    live = (
        f"<td class='{node_class(shown)}'>{escape(shown)}</td><td>{escape(slurm.reason or '')}</td>"
        if slurm is not None
        else "<td class='muted'>unknown</td><td></td>"
    )
    rows = "".join(
        f"<tr class='event'><td>{escape(timeline_line(e).split('  ', 1)[0])}</td><td>{escape(e.kind)}</td>"
        f"<td>{escape(e.verdict or '')}</td><td>{_incident_link(base, e)}</td><td>{escape(e.source)}</td>"
        f"<td>{escape(e.reason or '')}</td>"
        f"<td><details><summary>evidence</summary><pre>{escape(json.dumps(dict(e.evidence), indent=1, sort_keys=True))}</pre></details></td></tr>"
        for e in events
    )
    offender = (
        f"<b class='bad'>{escape(standing.headline)}: marked for replacement, never returned automatically</b>; "
        if standing.repeat_offender
        else ""
    )
    body = (
        f"<p><a href='{escape(base)}/'>longrun</a> / <a href='{escape(base)}/nodes'>nodes</a></p>"
        f"<h1>Node {escape(node)}</h1>"
        + (f"<p class='warn'>{escape(error)}</p>" if error else "")
        + f"<p id='node-state'>history: <b>{escape(h.state(events))}</b>; {offender}{escape(standing.why)}</p>"
        f"<table id='node-slurm'><tr><th>Slurm state</th><th>reason</th></tr><tr>{live}</tr></table>"
        f"<h2>Timeline</h2><table id='node-timeline'><tr><th>time (UTC)</th><th>event</th><th>verdict</th>"
        f"<th>run / incident</th><th>source</th><th>reason</th><th></th></tr>{rows}</table>"
        f"<p class='muted'>The same history: <code>longrun nodes show {escape(node)}</code>. Return it with the"
        f" <code>node_return</code> DAG (<a href='{escape(base)}/runbooks/node-return'>runbook</a>).</p>"
    )
    return page_html(f"node {node}", body)


def _incident_link(base: str, e: h.NodeEvent) -> str:
    if not e.run:
        return ""
    anchor = f"#incident-{escape(e.incident_id)}" if e.incident_id else ""
    label = escape(e.run) + (f" / {escape(e.incident_id)}" if e.incident_id else "")
    return f"<a href='{escape(base)}/runs/{escape(e.run)}{anchor}'>{label}</a>"
