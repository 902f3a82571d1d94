"""What the audit lists for a named run: the folders that hold its records, never the check batches, which
grow with ranks x steps (issue 31 item 3, docs/scale.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

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
