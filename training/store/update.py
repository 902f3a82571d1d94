"""Changing one object that several writers share: read it with its ETag, change it, write it back on
condition, and retry when another writer won. Both sides use it; no torch and no Airflow here.

The store has no transactions, only conditional writes (`ObjectStore.put_bytes`): `if_match=<ETag>`
succeeds only while the object is still the version that was read, `if_none_match=True` only while
there is none. Every shared record (an incident, the drain ledger, the incident lock, the promotion
pointer, a cached probe reference) is changed through the same discipline::

    read_versioned     the decoded object and the ETag of exactly the bytes decoded (or None)
    put_if_unchanged   write on condition of that version: If-Match, or If-None-Match for "none yet"
    update_json        both, in a loop: re-read and re-decide when another writer won
    create_or_read     If-None-Match only: create, or read what the first writer created
    create_once        If-None-Match only, the winner not needed

so of two writers racing from the same version exactly one wins, and the other decides again on what
the winner wrote (or, out of tries, gets UpdateConflict); nothing is ever written over a version that
was not read.

Bytes are the caller's: `update_json` takes a `dump` (`training.store.interface.dump_json` for most; each record keeps its exact byte format; the
corpus in tests/fixtures/records holds them) and a `load` (json.loads unless the caller must see
undecodable bytes itself).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from training.store.interface import NotFound, ObjectStore, PreconditionFailed, StoreError

#: Tries of `update_json` and of `read_versioned` unless the caller says otherwise.
ATTEMPTS = 8


class UpdateConflict(StoreError):
    """The object kept changing under us: every one of `attempts` tries lost to another writer (or, for
    a read, the object changed between reading its ETag and its bytes each time). Nothing was written
    by the try that gave up. Not a StoreUnavailable: the store answered; the key is contended."""

    def __init__(self, message: str, *, key: str, attempts: int) -> None:
        super().__init__(message)
        self.key = key
        self.attempts = attempts


@dataclass(frozen=True, slots=True)
class Versioned:
    """One version of an object: its bytes, their decoding, and the ETag of exactly those bytes."""

    value: Any
    """`data` decoded by the reader's `load`."""
    data: bytes
    """The bytes read."""
    etag: str
    """The ETag of `data`: an `if_match` with it succeeds only while the object is still `data`."""


@dataclass(frozen=True, slots=True)
class Updated:
    """What `update_json` left in the store."""

    value: Any
    """The object as it now stands: what `change` returned when it was written, else the value read
    (as `load` decoded it); None when the key is absent and nothing was created."""
    etag: str | None
    """Its ETag; None when absent."""
    written: bool
    """True when this call wrote it."""


@dataclass(frozen=True, slots=True)
class Created:
    """What `create_or_read` found: our bytes if we created the object, else the first writer's."""

    data: bytes
    created: bool


def read_versioned(
    store: ObjectStore,
    key: str,
    *,
    load: Callable[[bytes], Any] = json.loads,
    attempts: int = ATTEMPTS,
    what: str = "object",
) -> Versioned | None:
    """`key` decoded by `load`, with the ETag of exactly the bytes decoded; None when it is absent.

    A HEAD before and after the GET must agree, else the object changed in between and the read is
    tried again (`attempts` times, then UpdateConflict): a GET alone has no ETag, and a single HEAD's
    may be of another version than the bytes got, so that a later If-Match with it would not mean
    "unchanged since what I read". `load` runs once, on the bytes that passed; what it raises (a
    ValueError for bytes that do not decode) reaches the caller."""
    for _ in range(attempts):
        info = store.head(key)
        if info is None:
            return None
        try:
            data = store.get_bytes(key)
        except NotFound:
            continue  # deleted between HEAD and GET: look again
        again = store.head(key)
        if again is not None and again.etag == info.etag:
            return Versioned(load(data), data, info.etag)
    raise UpdateConflict(
        f"{what} {key} kept changing while being read in {store.describe()} ({attempts} attempts)",
        key=key,
        attempts=attempts,
    )


def put_if_unchanged(store: ObjectStore, key: str, data: bytes, etag: str | None) -> str:
    """Write `data` only if `key` is still at `etag`, or, with `etag` None, only if there is no `key`
    (the caller read nothing). Returns the new ETag. PreconditionFailed when another writer got there
    first, also when the object was deleted since (some S3 servers answer an If-Match on a missing key
    with 404, which is the same lost race)."""
    try:
        if etag is None:
            return store.put_bytes(key, data, if_none_match=True).etag
        return store.put_bytes(key, data, if_match=etag).etag
    except NotFound:
        if etag is None:
            raise
        raise PreconditionFailed(f"{key} was deleted since ETag {etag} in {store.describe()}") from None


def update_json(
    store: ObjectStore,
    key: str,
    change: Callable[[Any], Any],
    *,
    dump: Callable[[Any], bytes],
    load: Callable[[bytes], Any] = json.loads,
    attempts: int = ATTEMPTS,
    create: bool = False,
    what: str = "object",
) -> Updated:
    """Read `key`, apply `change`, write the result back only if nobody wrote in between; retry if
    somebody did.

    Each try reads the current version (`read_versioned`) and calls `change(value)`, where value is
    the decoded object, or None when `key` is absent and `create` is set (absent without `create`:
    NotFound, `what` and `key` named). `change` returns the new object, or None for "write nothing".
    The result goes through `dump`; bytes equal to those read are not written either. The write is
    conditional on the version read (If-Match; If-None-Match="*" when creating); when it loses, the
    next try reads the winner's version and calls `change` again. So `change` must decide from its
    argument (and what it reads itself), may run several times, and must not assume its earlier runs
    took effect: only the run of the try that wrote (or wrote nothing) counts, and a caller that
    needs to know what `change` decided keeps it from that last run. `change` may edit its argument
    in place and return it.

    Whatever `change`, `load` or `dump` raise reaches the caller, and nothing is written by that try.
    After `attempts` lost tries: UpdateConflict naming `key`."""
    for _ in range(attempts):
        cur = read_versioned(store, key, load=load, what=what)
        if cur is None and not create:
            raise NotFound(f"{what} {key} does not exist in {store.describe()}")
        new = change(None if cur is None else cur.value)
        data = None if new is None else dump(new)
        if data is None or (cur is not None and data == cur.data):
            return Updated(None, None, False) if cur is None else Updated(cur.value, cur.etag, False)
        try:
            etag = put_if_unchanged(store, key, data, None if cur is None else cur.etag)
        except PreconditionFailed:
            continue  # another writer won: read its version and decide again
        return Updated(new, etag, True)
    raise UpdateConflict(
        f"{what} {key} kept changing under us in {store.describe()} ({attempts} attempts)",
        key=key,
        attempts=attempts,
    )


def create_or_read(store: ObjectStore, key: str, data: bytes, *, attempts: int = 2) -> Created:
    """Create `key` with `data` unless it exists (If-None-Match="*"); else the bytes that are there.

    For records written once by whoever comes first (a claim, a key, a directive, an incident's first
    version): of two writers, one creates and both end up with the creator's bytes. An object that
    vanishes between the refused create and the read is created again, `attempts` times in all, then
    UpdateConflict."""
    for _ in range(attempts):
        try:
            store.put_bytes(key, data, if_none_match=True)
            return Created(data, True)
        except PreconditionFailed:
            pass
        try:
            return Created(store.get_bytes(key), False)
        except NotFound:
            continue
    raise UpdateConflict(
        f"{key} kept appearing and vanishing in {store.describe()} ({attempts} attempts)",
        key=key,
        attempts=attempts,
    )


def create_once(store: ObjectStore, key: str, data: bytes) -> bool:
    """Create `key` with `data` unless it exists (If-None-Match="*"); True when this call created it.
    An existing object is left as it is and not read: for records whose first version stands (a
    history entry, a binding, a mark) and whose caller does not need it."""
    try:
        store.put_bytes(key, data, if_none_match=True)
        return True
    except PreconditionFailed:
        return False
