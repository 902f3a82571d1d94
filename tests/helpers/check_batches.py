"""Check records into the store the way the job's writer lays them out (training.events.EventWriter): one
batch file per rank and run of at most `every` steps, named by its first and last step. The pick and the
other readers take only records that match their batch's key (rank and steps) for evidence."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from training.records import schema
from training.store.interface import ObjectStore


def put_check_batches(
    store: ObjectStore, run: str, records: Iterable[Mapping[str, Any]], *, every: int = 20
) -> list[str]:
    """Write `records` as per-rank batches of at most `every` steps each; returns the keys written."""
    if not 1 <= every <= schema.CHECK_BATCH_MAX_SPAN:
        raise ValueError(f"every={every}: a batch spans 1 to {schema.CHECK_BATCH_MAX_SPAN} steps")
    by_rank: dict[int, list[Mapping[str, Any]]] = {}
    for r in records:
        by_rank.setdefault(int(r["rank"]), []).append(r)
    keys = []
    for rank, recs in sorted(by_rank.items()):
        recs = sorted(recs, key=lambda r: r["step"])
        while recs:
            first = recs[0]["step"]
            batch = [r for r in recs if r["step"] < first + every]
            recs = recs[len(batch) :]
            key = schema.store_key(run, schema.check_batch_path(first, batch[-1]["step"], rank))
            store.put_bytes(key, "".join(json.dumps(dict(r), sort_keys=True) + "\n" for r in batch).encode())
            keys.append(key)
    return keys
