"""What the audit lists for a named run: the folders that hold its records, never the check batches, which
grow with ranks x steps (issue 31 item 3, docs/scale.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from helpers.counting_store import CountingStore
from longrun.audit import reader

from training.records import schema
from training.store.interface import ObjectInfo
from training.store.local import LocalDirStore


class ListingStore(LocalDirStore):
    """A local store that remembers every prefix it was asked to list."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listed: list[str] = []

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.listed.append(prefix)
        return super().list(prefix)


def test_a_named_run_is_read_folder_by_folder_and_its_check_batches_are_never_listed(tmp_path: Path) -> None:
    store = ListingStore(tmp_path)
    run = "r1"
    keys = {
        "manifest": "checkpoints/step-00000010/manifest.json",
        "validation": "validations/step-00000010-a.json",
        "promotion": "promoted/current.json",
        "suspect": "suspect/s1.json",
        "incident": "incidents/i1.json",
    }
    for rel in [*keys.values(), schema.check_batch_path(1, 20, 0)]:
        store.put_bytes(schema.store_key(run, rel), json.dumps({"run": run}).encode())
    found = {kind: info.key for kind, _run, info, _obj, _err in reader.read_records(store, (run,))}
    assert found == {kind: schema.store_key(run, rel) for kind, rel in keys.items()}
    assert not [p for p in store.listed if schema.store_key(run, "checks/").startswith(p)], store.listed


def test_every_run_is_found_by_its_folder_and_no_check_batch_is_listed(tmp_path: Path) -> None:
    """No run named (the daily audit of every run): the runs come from one folder listing of runs/, and
    each is read folder by folder as a named one; a listing of all of runs/ would page through every
    check batch of every run."""
    store = ListingStore(tmp_path)
    for run in ("r1", "r2"):
        for rel in (
            "checkpoints/step-00000010/manifest.json",
            "incidents/i1.json",
            schema.check_batch_path(1, 20, 0),
        ):
            store.put_bytes(schema.store_key(run, rel), json.dumps({"run": run}).encode())
    found = sorted((kind, run) for kind, run, _info, _obj, _err in reader.read_records(store))
    assert found == [("incident", "r1"), ("incident", "r2"), ("manifest", "r1"), ("manifest", "r2")]
    assert not [
        p for p in store.listed if any(schema.store_key(r, "checks/").startswith(p) for r in ("r1", "r2"))
    ]


def _validation(run: str, step: int, ok: bool = True) -> bytes:
    rec = schema.record("validation", run=run, step=step, ok=ok, errors=[] if ok else ["bad"])
    return json.dumps(rec).encode()


def test_an_audit_through_its_cache_reads_only_new_and_changed_records_and_sees_the_same(
    tmp_path: Path,
) -> None:
    """The daily audit read every record of every run each day (growing with the age of the run). Through
    the record cache (keyed by each record's key and ETag, from the listing) it reads what is new or
    changed since the last audit; a record rewritten in place is read again, so the rewrite is seen."""
    disk = LocalDirStore(tmp_path)
    store = CountingStore(disk)  # counts reads; the audit's own put goes through to `disk`
    run = "r1"
    for step in range(1, 6):
        disk.put_bytes(schema.store_key(run, f"validations/step-{step:08d}-a.json"), _validation(run, step))
    disk.put_bytes(schema.store_key(run, "incidents/i1.json"), b"{not json")

    def read(cache: bool) -> list[tuple[str, dict | None, str | None]]:
        store.got.clear()
        return [
            (info.key, obj, err) for _k, _r, info, obj, err in reader.read_records(store, (run,), cache=cache)
        ]

    plain = read(cache=False)
    first = read(cache=True)  # fills the cache: every record read, as without one
    assert first == plain and len(store.got) == 6 + 1  # the records and the (absent) cache
    again = read(cache=True)
    assert again == plain and store.got == [reader.cache_key(run)]  # nothing but the cache
    # a new record and a rewritten one (a failing validation in place of a passing one): both read again
    disk.put_bytes(schema.store_key(run, "validations/step-00000006-a.json"), _validation(run, 6))
    rewritten = schema.store_key(run, "validations/step-00000003-a.json")
    disk.put_bytes(rewritten, _validation(run, 3, ok=False))
    later = read(cache=True)
    assert later == read(cache=False)
    assert dict((k, o) for k, o, _e in later)[rewritten]["ok"] is False
    read(cache=True)
    assert store.got == [reader.cache_key(run)]


def test_a_cache_that_does_not_read_is_ignored(tmp_path: Path) -> None:
    """The cache is the orchestrator's own, but one that does not read (or is another run's) only costs a
    full read, never a record."""
    store = LocalDirStore(tmp_path)
    run = "r1"
    store.put_bytes(schema.store_key(run, "validations/step-00000001-a.json"), _validation(run, 1))
    for bad in (
        b"[]",
        b"{not json",
        json.dumps({"kind": "audit_record_cache", "run": "r2", "records": {}}).encode(),
    ):
        store.put_bytes(reader.cache_key(run), bad)
        found = [(info.key, obj) for _k, _r, info, obj, _e in reader.read_records(store, (run,), cache=True)]
        assert found and found[0][1] is not None and found[0][1]["step"] == 1
