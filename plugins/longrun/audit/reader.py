"""The store records the audit reads: which keys, each parsed and validated against training.records.schema."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from typing import Any

from longrun.runview import list_runs
from training.records import schema
from training.store.interface import ObjectInfo, ObjectStore, StoreError, dump_json

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


#: Where the audit keeps what it read of each run's records (`audit/record-cache/<run>.json`, outside
#: `runs/`, so on the orchestrator's side and never audited itself): each record's parse, keyed by its key
#: and the ETag the listing gives. The next audit reads only the records that are new or whose ETag changed
#: (an ETag is the content's digest on both stores), so a daily audit reads a day's records, not the run's
#: whole history; a changed record is read again, so a rewrite is still seen.
CACHE_PREFIX = "audit/record-cache/"
_CACHE_KIND = "audit_record_cache"

Entry = dict[str, Any]
"""A cached read: `etag`, `kind`, `obj` (the record, or None) and `error` (why it does not read, or None)."""


def cache_key(run: str) -> str:
    return f"{CACHE_PREFIX}{run}.json"


def read_records(
    store: ObjectStore, runs: Iterable[str] = (), *, cache: bool = False
) -> Iterable[tuple[str, str, ObjectInfo, dict[str, Any] | None, str | None]]:
    """(kind, run, object info, record or None, parse error or None) for every record the audit reads: of
    the named `runs` (names checked by the caller: longrun.audit.config), else of every run. With `cache`,
    a record whose key and ETag the run's cache holds is taken from it, and the cache is written back when
    anything changed (one get and at most one put per run, besides the listings and the new records)."""
    # Every run: its folders found with one folder listing of runs/, so the check batches (ranks x steps)
    # are never paged through.
    for run in list(runs) or list_runs(store):
        known = _load_cache(store, run) if cache else {}
        seen: dict[str, Entry] = {}
        for info in (info for folder in _FOLDERS for info in store.list(f"runs/{run}/{folder}")):
            found = classify(info.key)
            if found is None:
                continue
            kind, _run = found
            hit = known.get(info.key)
            if hit is None or hit.get("etag") != info.etag or hit.get("kind") != kind:
                hit = _read(store, kind, run, info)
            seen[info.key] = hit
            yield kind, run, info, _copy(hit["obj"]), hit["error"]
        if cache and seen != known:
            store.put_bytes(cache_key(run), dump_json({"kind": _CACHE_KIND, "run": run, "records": seen}))


def _read(store: ObjectStore, kind: str, run: str, info: ObjectInfo) -> Entry:
    entry: Entry = {"etag": info.etag, "kind": kind, "obj": None, "error": None}
    try:
        obj = json.loads(store.get_bytes(info.key))
        schema.validate(kind, obj)
    except (ValueError, schema.SchemaError) as e:  # JSONDecodeError is a ValueError
        return {**entry, "error": f"{type(e).__name__}: {e}"}
    if obj["run"] != run:  # every kind the audit reads requires `run` (validated above)
        return {**entry, "error": f"record names run {obj['run']!r} but lies under runs/{run}/"}
    return {**entry, "obj": obj}


def _load_cache(store: ObjectStore, run: str) -> dict[str, Entry]:
    """The run's cache, or {} (nothing cached) when there is none or it does not read as one: then every
    record is read, as without a cache."""
    try:
        raw = json.loads(store.get_bytes(cache_key(run)))
    except (StoreError, ValueError):  # NotFound (no cache yet) is a StoreError
        return {}
    if not isinstance(raw, dict) or raw.get("kind") != _CACHE_KIND or raw.get("run") != run:
        return {}
    records = raw.get("records")
    if not isinstance(records, dict):
        return {}
    return {
        k: e
        for k, e in records.items()
        if isinstance(e, dict)
        and isinstance(e.get("etag"), str)
        and isinstance(e.get("kind"), str)
        and (e.get("obj") is None or isinstance(e.get("obj"), dict))
        and (e.get("error") is None or isinstance(e.get("error"), str))
        and (e.get("obj") is None) != (e.get("error") is None)
    }


def _copy(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """A caller's own copy: the cached parse stays as read."""
    return None if obj is None else copy.deepcopy(obj)
