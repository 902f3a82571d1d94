"""The run-health plots as PNG bytes, and the same plots saved into an incident record's folder.

Figures are built with `matplotlib.figure.Figure` and the Agg canvas directly, not pyplot: no global
figure registry, no GUI backend, safe in the API server's threads.
"""

from __future__ import annotations

import io

from longrun.ui.model import RunHealth
from training.records import schema
from training.store.interface import ObjectStore

# One colour per check, and the colours of what an operator must not miss.
CHECK_COLOURS = {"finite": "#1f77b4", "recompute": "#2ca02c", "weight_vote": "#9467bd"}
ALERT_COLOUR = "#d62728"
INCIDENT_COLOUR = "#ff7f0e"
PNG_DPI = 100


def _figure(width: float = 9.0, height: float = 3.6):  # noqa: ANN202 - matplotlib types stay local
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=PNG_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:  # noqa: ANN001
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _last_step(health: RunHealth) -> int:
    return max(
        [s for s, _ in health.loss_series]
        + [c.step for c in health.checks]
        + [v.step for v in health.votes]
        + [health.step or 0, health.total_steps or 0]
    )


def _short(incident_id: str) -> str:
    """'00000010-recompute-r000-1795972574' -> '00000010-recompute': enough to match the table."""
    return "-".join(incident_id.split("-")[:2])


def _side(step: int, last: int) -> dict[str, str]:
    """Labels near the right edge go left of their line, clear of the legend."""
    return {"ha": "right"} if step > 0.7 * (last + 1) else {"ha": "left"}


def _draw_passes(ax, trans, health: RunHealth) -> None:  # noqa: ANN001
    """Check passes: short ticks in a strip at the bottom of the axes, one row per check."""
    for row, check in enumerate(schema.CHECKS):
        passed = [c.step for c in health.checks if c.check == check and c.verdict == "pass"]
        if passed:
            y0 = 0.02 + 0.04 * row
            ax.vlines(
                passed,
                y0,
                y0 + 0.03,
                transform=trans,
                color=CHECK_COLOURS[check],
                linewidth=1,
                label=f"{check} pass ({len(passed)})",
            )


def _draw_alerts(ax, trans, health: RunHealth, last: int) -> None:  # noqa: ANN001
    """Failed checks and alerts: a red dashed line each, labelled at the top."""
    bad = [c for c in health.checks if c.verdict in ("fail", "alert")]
    for i, c in enumerate(bad):
        ax.axvline(
            c.step,
            color=ALERT_COLOUR,
            linewidth=1.5,
            linestyle="--",
            label="failed check / alert" if i == 0 else None,
        )
        ax.text(
            c.step,
            0.97 - 0.06 * (i % 4),
            f" {c.check} {c.verdict} @{c.step} ",
            transform=trans,
            color=ALERT_COLOUR,
            fontsize=8,
            va="top",
            **_side(c.step, last),
        )


def _draw_incidents(ax, trans, health: RunHealth, last: int) -> None:  # noqa: ANN001
    """Incidents: an orange band from the alert step, and a dotted line at the step relaunched from."""
    for i, (inc, step) in enumerate((x, x.step) for x in health.incidents if x.step is not None):
        ax.axvspan(
            step,
            max(last, step + 1),
            color=INCIDENT_COLOUR,
            alpha=0.12,
            label="incident (from alert step)" if i == 0 else None,
        )
        ax.text(
            step,
            0.75,
            f" incident {_short(inc.incident_id)} ",
            transform=trans,
            color=INCIDENT_COLOUR,
            fontsize=8,
            **_side(step, last),
        )
        if inc.restart_step is not None:
            ax.axvline(
                inc.restart_step,
                color=INCIDENT_COLOUR,
                linewidth=1.2,
                linestyle=":",
                label="relaunched from checkpoint" if i == 0 else None,
            )


def _draw_checkpoints(ax, trans, health: RunHealth) -> None:  # noqa: ANN001
    """Checkpoints: green triangles (validated, promoted), red ones pointing down (suspect, invalid)."""
    good = [c.step for c in health.checkpoints if c.state in ("validated", "promoted")]
    suspect = [c.step for c in health.checkpoints if c.state in ("suspect", "invalid")]
    if good:
        ax.plot(good, [0.2] * len(good), "^", transform=trans, color="#2ca02c", label="checkpoint (good)")
    if suspect:
        ax.plot(
            suspect,
            [0.2] * len(suspect),
            "v",
            transform=trans,
            color=ALERT_COLOUR,
            label="checkpoint (suspect/invalid)",
        )


def loss_png(health: RunHealth, *, title: str | None = None) -> bytes:
    """Loss over steps; passes as ticks along the bottom (one row per check), failed checks and alerts
    as red lines, incidents as an orange band from the alert step, checkpoints as triangles."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.set_title(title or f"{health.run}: loss over steps")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if health.loss_series:
        steps, losses = zip(*health.loss_series, strict=True)
        ax.plot(steps, losses, color="#333333", linewidth=1.4, marker="." if len(steps) < 60 else None)
    else:
        ax.text(0.5, 0.5, "no loss records yet", transform=ax.transAxes, ha="center", va="center")
    trans = ax.get_xaxis_transform()  # x in data, y in axes fraction
    # drawn in this order, so the legend lists them in this order
    _draw_passes(ax, trans, health)
    last = _last_step(health)
    _draw_alerts(ax, trans, health, last)
    _draw_incidents(ax, trans, health, last)
    _draw_checkpoints(ax, trans, health)
    ax.set_xlim(0, last + 1)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return _png(fig)


def fingerprint_png(health: RunHealth, *, title: str | None = None) -> bytes:
    """Replica-fingerprint agreement at each weight vote: the share of replicas that match the strict
    majority (1.0 = every replica holds the same weights); dissenting ranks are written at the dip."""
    fig = _figure(height=2.8)
    ax = fig.add_subplot()
    ax.set_title(title or f"{health.run}: replica weight-fingerprint agreement")
    ax.set_xlabel("step")
    ax.set_ylabel("replicas agreeing")
    ax.set_ylim(-0.05, 1.15)
    ax.set_xlim(0, _last_step(health) + 1)  # the loss plot's x range, so the two read together
    if not health.votes:
        ax.text(0.5, 0.5, "no weight votes yet", transform=ax.transAxes, ha="center", va="center")
        return _png(fig)
    steps = [v.step for v in health.votes]
    share = [v.agreeing / v.replicas for v in health.votes]
    ax.step(steps, share, where="post", color=CHECK_COLOURS["weight_vote"], linewidth=1.2)
    ok = [(s, f) for s, f, v in zip(steps, share, health.votes, strict=True) if not v.dissenters and f == 1]
    if ok:
        ax.plot(
            *zip(*ok, strict=True),
            "o",
            color=CHECK_COLOURS["weight_vote"],
            markersize=3,
            label="all replicas agree",
        )
    for i, v in enumerate(x for x in health.votes if x.dissenters or x.agreeing < x.replicas):
        ax.plot(
            [v.step],
            [v.agreeing / v.replicas],
            "X",
            color=ALERT_COLOUR,
            markersize=9,
            label="disagreement" if i == 0 else None,
        )
        who = ",".join(str(r) for r in v.dissenters) or "no majority"
        ax.annotate(
            f"{v.agreeing}/{v.replicas} @{v.step}\nrank {who}",
            (v.step, v.agreeing / v.replicas),
            textcoords="offset points",
            xytext=(6, -22),
            fontsize=8,
            color=ALERT_COLOUR,
        )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return _png(fig)


PLOTS = {"loss.png": loss_png, "fingerprints.png": fingerprint_png}


def incident_plot_key(run: str, incident_id: str, name: str) -> str:
    """Store key of an incident's plot: beside the record, under incidents/<id>/."""
    if not incident_id or "/" in incident_id or incident_id in (".", ".."):
        raise ValueError(f"incident_id = {incident_id!r}: must be a plain name")
    return schema.store_key(run, f"incidents/{incident_id}/{name}")


def render_incident_plots(
    store: ObjectStore, run: str, incident_id: str, *, health: RunHealth | None = None
) -> list[str]:
    """Render the run-health plots as they stand now into the incident's folder in the store; return the
    keys written. The incident helper calls this once the incident record exists (`health`: an already
    loaded view, to save a second read)."""
    from longrun.ui.data import load_run_health

    health = health or load_run_health(store, run)
    keys = []
    for name, draw in PLOTS.items():
        key = incident_plot_key(run, incident_id, name)
        store.put_bytes(key, draw(health, title=f"{run} / incident {incident_id}: {name[:-4]}"))
        keys.append(key)
    return keys
