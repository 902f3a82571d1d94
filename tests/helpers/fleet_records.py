"""Set the store's fleet-wide records aside for one test, and put them back after it.

Most records live under `runs/<run>/`, and tests use run names of their own. A few are fleet-wide: the
node history (`nodes/<node>/...`) and the drain ledger (`ops/drain-ledger.json`). One test session shares
one store, so a drill that drains n2 would otherwise leave n2 a "repeat offender" for every later test, and
ten drills fill the drain rate limit for the tests after them. CI runs the whole suite in one session, so
each test that can touch the store starts with these records empty and leaves them as it found them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from training.store.interface import ObjectStore

FLEET_PREFIXES = ("nodes/", "ops/drain-ledger.json")


def _snapshot(store: ObjectStore) -> dict[str, bytes]:
    return {
        info.key: store.get_bytes(info.key) for prefix in FLEET_PREFIXES for info in list(store.list(prefix))
    }


def _clear(store: ObjectStore) -> None:
    for prefix in FLEET_PREFIXES:
        for info in list(store.list(prefix)):
            store.delete(info.key)


@contextmanager
def fleet_records_set_aside(stores: list[ObjectStore]) -> Iterator[None]:
    """Empty the fleet-wide records of every store in `stores` for the duration; restore them afterwards
    (what the test wrote there is deleted), also when the test fails."""
    saved = [(store, _snapshot(store)) for store in stores]
    for store in stores:
        _clear(store)
    try:
        yield
    finally:
        for store, records in saved:
            _clear(store)
            for key, body in records.items():
                store.put_bytes(key, body)
