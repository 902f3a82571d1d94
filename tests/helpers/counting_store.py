"""A store wrapper for tests that count what a reader asks of the store: it delegates to a real store and
records each get's key and each listing's prefix, so a test can say how many requests of which kind a
reader made (as S3 would bill them: one per get, one per listing call)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from training.store.interface import ObjectInfo, ObjectStore


class CountingStore:
    """Delegates `get_bytes`, `head`, `list`, `list_dirs` and `put_bytes` to `inner`; `count` by kind, `got`
    every key read."""

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

    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> ObjectInfo:
        self.count["put"] += 1
        return self.inner.put_bytes(key, data, if_none_match=if_none_match, if_match=if_match)
