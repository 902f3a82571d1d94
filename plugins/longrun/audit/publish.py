"""Upload an audit's Data Docs, JSON results and table to the store under `<prefix><audit_id>/`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from training.store.interface import ObjectStore, put_json
from training.store.sides import SidedStore


def object_url(store: ObjectStore, key: str) -> str:
    """A link to `key` a person can open: http(s) for an S3 endpoint, s3:// for AWS, file:// for a local
    store. Never contains credentials."""
    if isinstance(store, SidedStore):
        store = store.side(key)
    endpoint = getattr(store, "endpoint_url", None)
    bucket = getattr(store, "bucket", None)
    if bucket and endpoint:
        return f"{endpoint.rstrip('/')}/{bucket}/{key}"
    if bucket:
        return f"s3://{bucket}/{key}"
    root = getattr(store, "root", None)
    if root is not None:
        return (Path(root).resolve() / key).as_uri()
    return f"{store.describe()}: {key}"


def upload_dir(store: ObjectStore, local_dir: str | os.PathLike[str], prefix: str) -> list[str]:
    """Upload every file under `local_dir` to `prefix` + its relative path; returns the keys, sorted."""
    keys = []
    base = Path(local_dir)
    for path in sorted(p for p in base.rglob("*") if p.is_file()):
        key = prefix + path.relative_to(base).as_posix()
        store.put_file(key, path)
        keys.append(key)
    return keys


def publish(
    store: ObjectStore,
    *,
    prefix: str,
    docs_dir: str | os.PathLike[str],
    results: dict[str, Any],
    summary: dict[str, Any],
    table_csv: bytes,
) -> dict[str, str]:
    """Write the report; returns {'docs', 'results', 'summary', 'table'} -> store key. The summary goes
    last, so its presence means the report is complete."""
    upload_dir(store, docs_dir, prefix + "docs/")
    keys = {
        "docs": prefix + "docs/index.html",
        "results": prefix + "results.json",
        "table": prefix + "table.csv",
        "summary": prefix + "summary.json",
    }
    store.put_bytes(keys["results"], json.dumps(results, indent=1, sort_keys=True, default=str).encode())
    store.put_bytes(keys["table"], table_csv)
    put_json(store, keys["summary"], summary)
    return keys
