"""The object store's interface: its errors, `ObjectInfo`, the `ObjectStore` protocol, the key check and the
JSON helpers every store shares. Import these from `training.store`, which names them all.

Keys are '/'-separated and relative to the store root (the bucket, or the directory). Errors form two
families::

    StoreError
    +-- StoreUnavailable      retryable: endpoint down, throttled, 5xx after our own retries
    +-- StoreTerminal         retrying will not help
        +-- NotFound
        +-- PreconditionFailed    a conditional write lost (someone else wrote first / the ETag moved)
        +-- StoreAuthError        wrong or missing credentials, access denied
        +-- StoreConfigError      bad environment (no bucket name, bad directory)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


class StoreError(Exception):
    """Base of every store error."""


class StoreUnavailable(StoreError):
    """The store did not answer usefully; retrying later may help."""


class StoreTerminal(StoreError):
    """Retrying the same call will not help."""


class NotFound(StoreTerminal):
    pass


class PreconditionFailed(StoreTerminal):
    pass


class StoreAuthError(StoreTerminal):
    pass


class StoreConfigError(StoreTerminal):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectInfo:
    key: str
    """Key relative to the store root."""
    size: int
    """Size in bytes."""
    etag: str
    """Opaque version tag, usable with `if_match`."""
    sha256: str | None = None
    """Hex SHA-256 of the content when the writer recorded it (longrun always does)."""


@runtime_checkable
class ObjectStore(Protocol):
    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> ObjectInfo:
        """Write `data` atomically. `if_none_match`: fail if the key exists. `if_match`: fail unless the
        current ETag equals it. Raises PreconditionFailed when the condition does not hold."""
        ...

    def put_file(self, key: str, path: str | os.PathLike[str], *, sha256: str | None = None) -> ObjectInfo:
        """Upload a file (multipart when large); readers never see a partial object. `sha256`: the
        caller's hash of the file, recorded as is (saves hashing it twice); computed when None."""
        ...

    def get_bytes(self, key: str) -> bytes: ...

    def download(self, key: str, path: str | os.PathLike[str]) -> None: ...

    def head(self, key: str) -> ObjectInfo | None:
        """Metadata of `key`, or None if it does not exist."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, in key order."""
        ...

    def list_dirs(self, prefix: str) -> Iterator[str]:
        """The folders directly under `prefix` (which is "" or ends with "/") that hold at least one
        object, each as its full key prefix ending with "/", in key order: S3's common prefixes for the
        delimiter "/". Finds the runs under `runs/` without paging through every object of every run. A
        folder emptied by deletes may still be named (SeaweedFS keeps its directory entry): a caller
        finds nothing in it."""
        ...

    def delete(self, key: str) -> None: ...

    def describe(self) -> str:
        """Where this store is, for messages (never includes credentials)."""
        ...


def sha256_file(path: str | os.PathLike[str], chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def dump_json(obj: Any) -> bytes:
    """A JSON record as the store holds it: sorted keys, indent 1. The one byte format of every record
    written whole (the check batches are lines of their own); readers and the record corpus rely on it."""
    return json.dumps(obj, sort_keys=True, indent=1).encode()


def put_json(store: ObjectStore, key: str, obj: Any, **conditions: Any) -> ObjectInfo:
    return store.put_bytes(key, dump_json(obj), **conditions)


def get_json(store: ObjectStore, key: str) -> Any:
    return json.loads(store.get_bytes(key))


def check_dir_prefix(prefix: str) -> str:
    """`prefix` if it names a folder ("" or ending with "/"), else a ValueError."""
    if prefix and not prefix.endswith("/"):
        raise ValueError(f"list_dirs({prefix!r}): a folder prefix is empty or ends with '/'")
    return prefix


def _check_key(key: str) -> str:
    if (
        not key
        or key.startswith("/")
        or "\\" in key
        or any(p in ("", ".", "..") for p in key.split("/")[:-1])
    ):
        raise StoreConfigError(f"object key {key!r} is not a clean relative key")
    if key.endswith("/") or key.split("/")[-1] in (".", ".."):
        raise StoreConfigError(f"object key {key!r} does not name an object")
    return key
