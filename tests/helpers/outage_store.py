"""A store wrapper for tests of readers that must wait through an outage: it delegates to a real store and
answers its first `down` reads with StoreUnavailable, as a store that is down for a while does."""

from __future__ import annotations

from typing import Any

from training.store.interface import ObjectStore, StoreUnavailable


class OutageStore:
    """`inner`, except that its first `down` `get_bytes` calls raise StoreUnavailable (`refused` counts them)."""

    def __init__(self, inner: ObjectStore, down: int) -> None:
        self.inner, self.down, self.refused = inner, down, 0

    def __getattr__(self, name: str) -> Any:  # every other call: the real store
        return getattr(self.inner, name)

    def get_bytes(self, key: str) -> bytes:
        if self.refused < self.down:
            self.refused += 1
            raise StoreUnavailable(f"get {key}: cannot reach the store (test outage)")
        return self.inner.get_bytes(key)
