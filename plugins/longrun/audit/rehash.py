"""Re-hash a seeded sample of stored payload files against the SHA-256 their manifests record.

The store's own metadata hash (S3 `x-amz-meta-sha256`, the local store's sidecar) is what the writer
claimed; only downloading the bytes and hashing them again finds an object that changed after the write.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pandas as pd

from training.store.interface import NotFound, ObjectStore, StoreError, sha256_file


def sample_rows(table: pd.DataFrame, sample_size: int, seed: int) -> list[int]:
    """Index labels of up to `sample_size` file rows, drawn with `seed` from the rows in key order (so the
    same store and seed give the same sample)."""
    # `#files[i]` rows are manifest entries that name no object: nothing to download.
    files = table[(table["kind"] == "file") & ~table["key"].str.contains("#", regex=False)].sort_values("key")
    labels = list(files.index)
    return sorted(random.Random(seed).sample(labels, min(sample_size, len(labels))))


def rehash_sample(store: ObjectStore, table: pd.DataFrame, *, sample_size: int, seed: int) -> int:
    """Download and hash the sampled files; fill `rehashed`, `rehash_ok`, `rehash_error` in place.
    Returns how many files were re-hashed."""
    picked = sample_rows(table, sample_size, seed)
    with tempfile.TemporaryDirectory(prefix="longrun-audit-") as tmp:
        target = Path(tmp) / "object"
        for label in picked:
            key = table.at[label, "key"]
            error = None
            try:
                store.download(key, target)
                digest = sha256_file(target)
                if digest != table.at[label, "sha256"]:
                    error = f"sha256 {digest} != manifest {table.at[label, 'sha256']}"
            except NotFound:
                error = "missing from the store"
            except StoreError as e:
                # An unreachable store is not evidence of corruption, but the audit cannot vouch either.
                error = f"could not read: {e}"
            finally:
                target.unlink(missing_ok=True)
            table.at[label, "rehashed"] = True
            table.at[label, "rehash_ok"] = error is None
            table.at[label, "rehash_error"] = error
    return len(picked)
