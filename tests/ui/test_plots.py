"""The plots: real PNGs from the drill's records, and the incident's copies in the store."""

from __future__ import annotations

import dataclasses
import io

import pytest
from longrun.ui import data, plots

from training.records import schema
from training.store.local import LocalDirStore
from ui.drill_records import fill_drill

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def store(tmp_path):
    return LocalDirStore(tmp_path / "store")


def png_size(png: bytes) -> tuple[int, int]:
    assert png.startswith(PNG_MAGIC)
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_loss_and_fingerprint_plots_are_pngs(store):
    fill_drill(store)
    h = data.load_run_health(store, "drill-1")
    assert png_size(plots.loss_png(h)) == (900, 360)
    assert png_size(plots.fingerprint_png(h)) == (900, 280)


def test_plots_of_an_empty_run_still_render(store):
    h = data.load_run_health(store, "empty")
    for draw in plots.PLOTS.values():
        assert draw(h).startswith(PNG_MAGIC)


def test_alert_is_drawn_in_red(store):
    """The alert line must be visible: red pixels appear only when the drill has an alert."""
    from matplotlib.image import imread

    fill_drill(store)
    h = data.load_run_health(store, "drill-1")
    passes = tuple(c for c in h.checks if c.verdict == "pass")
    quiet = dataclasses.replace(h, checks=passes, incidents=(), checkpoints=())

    def red_pixels(png: bytes) -> int:
        img = imread(io.BytesIO(png))
        r, g, b = img[..., 0], img[..., 1], img[..., 2]
        return int(((r > 0.75) & (g < 0.3) & (b < 0.3)).sum())

    assert red_pixels(plots.loss_png(h)) > 100
    assert red_pixels(plots.loss_png(quiet)) == 0


def test_render_incident_plots_writes_beside_the_record(store):
    ident = fill_drill(store)
    keys = plots.render_incident_plots(store, "drill-1", ident)
    assert keys == [
        schema.store_key("drill-1", f"incidents/{ident}/loss.png"),
        schema.store_key("drill-1", f"incidents/{ident}/fingerprints.png"),
    ]
    for k in keys:
        assert store.get_bytes(k).startswith(PNG_MAGIC)
    # The view lists them with the incident, and they are not mistaken for incident records.
    h = data.load_run_health(store, "drill-1")
    (inc,) = h.incidents
    assert inc.plots == (f"incidents/{ident}/fingerprints.png", f"incidents/{ident}/loss.png")
    assert h.problems == ()


def test_incident_id_must_be_a_plain_name(store):
    with pytest.raises(ValueError, match="incident_id = 'a/b'"):
        plots.render_incident_plots(store, "drill-1", "a/b")
