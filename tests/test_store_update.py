"""training.store.update: read-modify-conditional-write and create-once, against the local directory store
and SeaweedFS S3 (the session's local stack, as in tests/checkpoints/test_store_contract.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from training.store.interface import (
    NotFound,
    ObjectInfo,
    ObjectStore,
    PreconditionFailed,
    dump_json,
    put_json,
)
from training.store.local import LocalDirStore
from training.store.update import (
    UpdateConflict,
    create_once,
    create_or_read,
    put_if_unchanged,
    read_versioned,
    update_json,
)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    if request.param == "local":
        return LocalDirStore(tmp_path / "store")
    from training.store.s3 import S3Store

    env: dict[str, str] = request.getfixturevalue("s3_store_env")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return S3Store(bucket=env["LONGRUN_BUCKET"], endpoint_url=env["AWS_ENDPOINT_URL"])


@pytest.fixture
def key() -> str:
    """A key of its own per test, so tests sharing the session's bucket never see each other."""
    return f"runs/t-{uuid.uuid4().hex[:10]}/shared.json"


class Spy:
    """`store`, counting writes; `before_get(n)` runs before the n-th GET (1-based)."""

    def __init__(self, store: ObjectStore, before_get: Any = None) -> None:
        self.inner, self.before_get, self.puts, self.gets = store, before_get, 0, 0

    def put_bytes(self, key: str, data: bytes, **conditions: Any) -> ObjectInfo:
        self.puts += 1
        return self.inner.put_bytes(key, data, **conditions)

    def get_bytes(self, key: str) -> bytes:
        self.gets += 1
        if self.before_get is not None:
            self.before_get(self.gets)
        return self.inner.get_bytes(key)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def describe(self) -> str:
        return self.inner.describe()


def _add(item: str) -> Any:
    def change(obj: dict[str, Any]) -> dict[str, Any]:
        obj["items"].append(item)
        return obj

    return change


def test_dump_json_is_put_dump_json(store: ObjectStore, key: str) -> None:
    obj = {"b": [1, 2], "a": {"z": None, "y": 1.5}}
    put_json(store, key, obj)
    assert store.get_bytes(key) == dump_json(obj)


def test_read_versioned(store: ObjectStore, key: str) -> None:
    assert read_versioned(store, key) is None
    info = store.put_bytes(key, b'{"n": 1}')
    got = read_versioned(store, key)
    assert got is not None and got.value == {"n": 1} and got.data == b'{"n": 1}'
    head = store.head(key)
    assert head is not None and got.etag == head.etag == info.etag
    assert read_versioned(store, key, load=bytes) == got.__class__(b'{"n": 1}', b'{"n": 1}', info.etag)


def test_read_versioned_rereads_when_the_object_changes_under_the_get(store: ObjectStore, key: str) -> None:
    store.put_bytes(key, b'{"n": 1}')

    def writer(n: int) -> None:
        if n == 1:
            store.put_bytes(key, b'{"n": 2}')  # between the first HEAD and its GET

    spy = Spy(store, writer)
    got = read_versioned(spy, key)  # type: ignore[arg-type]
    assert got is not None and got.value == {"n": 2} and spy.gets == 2
    head = store.head(key)
    assert head is not None and got.etag == head.etag


def test_read_versioned_gives_up_naming_the_key(store: ObjectStore, key: str) -> None:
    store.put_bytes(key, b"0")
    spy = Spy(store, lambda n: store.put_bytes(key, str(n).encode()))
    with pytest.raises(UpdateConflict, match=key) as e:
        read_versioned(spy, key, attempts=3)  # type: ignore[arg-type]
    assert e.value.key == key and e.value.attempts == 3 and spy.gets == 3


def test_update_creates_when_asked(store: ObjectStore, key: str) -> None:
    seen = []

    def change(obj: Any) -> dict[str, Any]:
        seen.append(obj)
        return {"items": ["a"]}

    res = update_json(store, key, change, dump=dump_json, create=True)
    assert seen == [None] and res.written and res.value == {"items": ["a"]}
    assert store.get_bytes(key) == dump_json({"items": ["a"]})
    head = store.head(key)
    assert head is not None and res.etag == head.etag


def test_update_changes_with_the_callers_bytes(store: ObjectStore, key: str) -> None:
    store.put_bytes(key, json.dumps({"items": []}).encode())
    compact = lambda obj: json.dumps(obj, separators=(",", ":")).encode()  # noqa: E731
    res = update_json(store, key, _add("a"), dump=compact)
    assert res.written and res.value == {"items": ["a"]}
    assert store.get_bytes(key) == b'{"items":["a"]}'


def test_update_of_an_absent_object_without_create_is_notfound(store: ObjectStore, key: str) -> None:
    called = []
    with pytest.raises(NotFound, match=key):
        update_json(store, key, called.append, dump=dump_json, what="ledger")
    assert called == [] and store.head(key) is None


def test_a_change_to_nothing_writes_nothing(store: ObjectStore, key: str) -> None:
    before = store.put_bytes(key, dump_json({"items": ["a"]}))
    spy = Spy(store)
    res = update_json(spy, key, lambda obj: None, dump=dump_json)  # type: ignore[arg-type]
    assert not res.written and res.value == {"items": ["a"]} and res.etag == before.etag
    res = update_json(spy, key, lambda obj: obj, dump=dump_json)  # type: ignore[arg-type]
    assert not res.written and res.value == {"items": ["a"]} and res.etag == before.etag
    assert spy.puts == 0
    # absent, create asked, but nothing to create
    res = update_json(spy, key + ".2", lambda obj: None, dump=dump_json, create=True)  # type: ignore[arg-type]
    assert (res.value, res.etag, res.written) == (None, None, False) and spy.puts == 0
    assert store.head(key + ".2") is None


def test_same_value_in_other_bytes_is_rewritten(store: ObjectStore, key: str) -> None:
    store.put_bytes(key, b'{"items": ["a"]}')
    res = update_json(store, key, lambda obj: obj, dump=dump_json)
    assert res.written and store.get_bytes(key) == dump_json({"items": ["a"]})


def test_a_lost_race_is_decided_again_on_the_winners_version(store: ObjectStore, key: str) -> None:
    put_json(store, key, {"items": []})
    calls = []

    def change(obj: dict[str, Any]) -> dict[str, Any]:
        calls.append(list(obj["items"]))
        if len(calls) == 1:  # another writer gets there between our read and our write
            put_json(store, key, {"items": ["theirs"]})
        obj["items"].append("ours")
        return obj

    res = update_json(store, key, change, dump=dump_json)
    assert calls == [[], ["theirs"]]
    assert res.written and json.loads(store.get_bytes(key)) == {"items": ["theirs", "ours"]}


def test_a_lost_create_race_is_decided_on_the_winners_object(store: ObjectStore, key: str) -> None:
    calls = []

    def change(obj: Any) -> dict[str, Any]:
        calls.append(json.loads(json.dumps(obj)))  # as it came in
        if obj is None:
            put_json(store, key, {"items": ["theirs"]})
            return {"items": ["ours"]}
        obj["items"].append("ours")
        return obj

    update_json(store, key, change, dump=dump_json, create=True)
    assert calls == [None, {"items": ["theirs"]}]
    assert json.loads(store.get_bytes(key)) == {"items": ["theirs", "ours"]}


def test_a_race_lost_every_time_is_an_update_conflict_naming_the_key(store: ObjectStore, key: str) -> None:
    put_json(store, key, {"items": []})
    calls = []

    def change(obj: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        put_json(store, key, {"items": [f"theirs-{len(calls)}"]})
        return {"items": ["ours"]}

    with pytest.raises(UpdateConflict, match=f"drain ledger {key} kept changing") as e:
        update_json(store, key, change, dump=dump_json, attempts=3, what="drain ledger")
    assert e.value.key == key and e.value.attempts == 3
    assert len(calls) == 3
    assert json.loads(store.get_bytes(key)) == {"items": ["theirs-3"]}  # never ours


def test_a_change_that_raises_leaves_the_object_unchanged(store: ObjectStore, key: str) -> None:
    before = store.put_bytes(key, dump_json({"items": ["a"]}))

    def change(obj: dict[str, Any]) -> dict[str, Any]:
        obj["items"].append("half-done")
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        update_json(store, key, change, dump=dump_json)
    head = store.head(key)
    assert head is not None and head.etag == before.etag
    assert store.get_bytes(key) == dump_json({"items": ["a"]})


def test_bytes_that_do_not_decode_reach_the_caller_or_its_change(store: ObjectStore, key: str) -> None:
    store.put_bytes(key, b"\x00{garbled")
    with pytest.raises(ValueError):
        update_json(store, key, _add("a"), dump=dump_json)
    res = update_json(store, key, lambda raw: {"was": raw.decode("latin-1")}, dump=dump_json, load=bytes)
    assert res.written and json.loads(store.get_bytes(key)) == {"was": "\x00{garbled"}


def test_put_if_unchanged(store: ObjectStore, key: str) -> None:
    first = put_if_unchanged(store, key, b"1", None)
    with pytest.raises(PreconditionFailed):
        put_if_unchanged(store, key, b"2", None)  # exists now
    second = put_if_unchanged(store, key, b"2", first)
    with pytest.raises(PreconditionFailed):
        put_if_unchanged(store, key, b"3", first)  # stale
    head = store.head(key)
    assert store.get_bytes(key) == b"2" and head is not None and head.etag == second
    store.delete(key)
    with pytest.raises(PreconditionFailed):
        put_if_unchanged(store, key, b"4", second)  # deleted since
    assert store.head(key) is None


def test_create_or_read(store: ObjectStore, key: str) -> None:
    mine = create_or_read(store, key, b"first")
    assert mine.created and mine.data == b"first"
    spy = Spy(store)
    theirs = create_or_read(spy, key, b"second")  # type: ignore[arg-type]
    assert not theirs.created and theirs.data == b"first"
    assert store.get_bytes(key) == b"first" and spy.puts == 1


def test_create_or_read_creates_again_when_the_winner_vanishes(store: ObjectStore, key: str) -> None:
    store.put_bytes(key, b"theirs")
    spy = Spy(store, lambda n: store.delete(key))  # gone before every read of the winner
    got = create_or_read(spy, key, b"mine")  # type: ignore[arg-type]
    assert got.created and store.get_bytes(key) == b"mine" and spy.gets == 1

    store.put_bytes(key, b"theirs")
    with pytest.raises(UpdateConflict, match=key):
        create_or_read(Spy(store, lambda n: store.delete(key)), key, b"mine", attempts=1)  # type: ignore[arg-type]
    assert store.head(key) is None


def test_create_once(store: ObjectStore, key: str) -> None:
    assert create_once(store, key, b"first")
    spy = Spy(store)
    assert not create_once(spy, key, b"second")  # type: ignore[arg-type]
    assert spy.gets == 0 and store.get_bytes(key) == b"first"
