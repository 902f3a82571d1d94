"""A store wrapper for tests that count what a reader asks of the store: it delegates to a real store and
records each get's key and each listing's prefix, so a test can say how many requests of which kind a
reader made (as S3 would bill them: one per get, one per listing call)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from training.store.interface import ObjectInfo, ObjectStore


class CountingStore:
    """Delegates `get_bytes`, `head`, `list` and `list_dirs` to `inner`; `count` by kind, `got` every key
    read."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.count, self.got = inner, Counter[str](), list[str]()

    def get_bytes(self, key: str) -> bytes:
        self.count["get"] += 1
        self.got.append(key)
        return self.inner.get_bytes(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.count["list"] += 1
        return self.inner.list(prefix)

    def list_dirs(self, prefix: str) -> Iterator[str]:
        self.count["list"] += 1
        return self.inner.list_dirs(prefix)

    def head(self, key: str) -> ObjectInfo | None:
        self.count["head"] += 1
        return self.inner.head(key)
