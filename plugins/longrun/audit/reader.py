"""The store records the audit reads: which keys, each parsed and validated against training.records.schema."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from longrun.runview import list_runs
from training.records import schema
from training.store.interface import ObjectInfo, ObjectStore

# Relative (to runs/<run>/) key patterns of the records the audit reads; see training.records.schema's layout.
_KINDS = (
    ("manifest", re.compile(r"^checkpoints/step-\d{8}/manifest\.json$")),
    ("validation", re.compile(r"^validations/[^/]+\.json$")),
    ("promotion", re.compile(r"^promoted/(current|history/[^/]+)\.json$")),
    ("suspect", re.compile(r"^suspect/[^/]+\.json$")),
    ("incident", re.compile(r"^incidents/[^/]+\.json$")),
)

_RUN_KEY = re.compile(r"^runs/([^/]+)/(.+)$")
#: The folders under a run that hold what _KINDS matches, in key order. A named run is listed folder by
#: folder, so the audit never pages through the check batches (which grow with ranks x steps).
_FOLDERS = ("checkpoints/", "incidents/", "promoted/", "suspect/", "validations/")


def classify(key: str) -> tuple[str, str] | None:
    """(kind, run) of a store key the audit reads, or None for payload, alerts, progress and the rest."""
    m = _RUN_KEY.match(key)
    if not m:
        return None
    run, rel = m.groups()
    for kind, pattern in _KINDS:
        if pattern.match(rel):
            return kind, run
    return None


def read_records(
    store: ObjectStore, runs: Iterable[str] = ()
) -> Iterable[tuple[str, str, ObjectInfo, dict[str, Any] | None, str | None]]:
    """(kind, run, object info, record or None, parse error or None) for every record the audit reads: of
    the named `runs` (names checked by the caller: longrun.audit.config), else of every run."""
    # Every run: its folders found with one folder listing of runs/, so the check batches (ranks x steps)
    # are never paged through.
    runs = list(runs) or list_runs(store)
    prefixes = [f"runs/{run}/{folder}" for run in runs for folder in _FOLDERS]
    for info in (info for prefix in prefixes for info in store.list(prefix)):
        found = classify(info.key)
        if found is None:
            continue
        kind, run = found
        try:
            obj = json.loads(store.get_bytes(info.key))
            schema.validate(kind, obj)
        except (ValueError, schema.SchemaError) as e:  # JSONDecodeError is a ValueError
            yield kind, run, info, None, f"{type(e).__name__}: {e}"
            continue
        if obj["run"] != run:  # every kind the audit reads requires `run` (validated above)
            yield kind, run, info, None, f"record names run {obj['run']!r} but lies under runs/{run}/"
            continue
        yield kind, run, info, obj, None
