"""The object store contract: the same tests against the local directory store and SeaweedFS S3."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from training.store.factory import store_from_spec, store_spec
from training.store.interface import (
    NotFound,
    ObjectStore,
    PreconditionFailed,
    StoreConfigError,
    get_json,
    put_json,
)
from training.store.s3 import S3Store


def test_put_get_head_roundtrip(store: ObjectStore, run: str) -> None:
    key = f"runs/{run}/a/b.bin"
    assert store.head(key) is None
    info = store.put_bytes(key, b"hello")
    assert info.size == 5 and info.sha256 == hashlib.sha256(b"hello").hexdigest()
    assert store.get_bytes(key) == b"hello"
    head = store.head(key)
    assert head is not None and head.size == 5 and head.etag == info.etag
    assert head.sha256 == info.sha256


def test_missing_key_is_notfound(store: ObjectStore, run: str) -> None:
    with pytest.raises(NotFound):
        store.get_bytes(f"runs/{run}/nope")
    with pytest.raises(NotFound):
        store.download(f"runs/{run}/nope", os.devnull)


def test_if_none_match_refuses_an_existing_key(store: ObjectStore, run: str) -> None:
    key = f"runs/{run}/pointer.json"
    store.put_bytes(key, b"1", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put_bytes(key, b"2", if_none_match=True)
    assert store.get_bytes(key) == b"1"


def test_if_match_needs_the_current_etag(store: ObjectStore, run: str) -> None:
    key = f"runs/{run}/pointer.json"
    first = store.put_bytes(key, b"1")
    second = store.put_bytes(key, b"2", if_match=first.etag)
    with pytest.raises(PreconditionFailed):
        store.put_bytes(key, b"3", if_match=first.etag)  # stale
    assert store.get_bytes(key) == b"2"
    store.put_bytes(key, b"4", if_match=second.etag)
    assert store.get_bytes(key) == b"4"


def test_if_match_on_a_missing_key_fails(store: ObjectStore, run: str) -> None:
    with pytest.raises((PreconditionFailed, NotFound)):
        store.put_bytes(f"runs/{run}/none.json", b"x", if_match='"0123"')


@pytest.mark.parametrize("size", [1000, 11 << 20], ids=["small", "multipart"])
def test_put_file_records_sha256(store: ObjectStore, run: str, tmp_path: Path, size: int) -> None:
    src = tmp_path / "payload"
    data = os.urandom(size)
    src.write_bytes(data)
    key = f"runs/{run}/file.bin"
    info = store.put_file(key, src)
    digest = hashlib.sha256(data).hexdigest()
    assert info.size == size and info.sha256 == digest
    head = store.head(key)
    assert head is not None and head.sha256 == digest
    if isinstance(store, S3Store) and size > store.multipart_threshold:
        assert "-" in head.etag, head.etag  # a multipart upload's ETag is "<md5 of part md5s>-<parts>"
    out = tmp_path / "back"
    store.download(key, out)
    assert out.read_bytes() == data


def test_put_file_takes_the_callers_hash(store: ObjectStore, run: str, tmp_path: Path) -> None:
    src = tmp_path / "p"
    src.write_bytes(b"abc")
    info = store.put_file(f"runs/{run}/p", src, sha256=hashlib.sha256(b"abc").hexdigest())
    assert info.sha256 == hashlib.sha256(b"abc").hexdigest()


def test_list_is_by_prefix_in_key_order(store: ObjectStore, run: str) -> None:
    for k in ("b/2", "a/1", "b/1", "c"):
        store.put_bytes(f"runs/{run}/{k}", k.encode())
    store.put_bytes(f"runs/{run}x/other", b"-")
    assert [i.key for i in store.list(f"runs/{run}/b/")] == [f"runs/{run}/b/1", f"runs/{run}/b/2"]
    assert [i.key for i in store.list(f"runs/{run}/")] == [
        f"runs/{run}/{k}" for k in ("a/1", "b/1", "b/2", "c")
    ]
    sizes = {i.key: i.size for i in store.list(f"runs/{run}/")}
    assert sizes[f"runs/{run}/c"] == 1


def test_list_dirs_names_the_folders_that_hold_objects(store: ObjectStore, run: str) -> None:
    """S3's common prefixes for the delimiter "/": each folder that holds an object once, in key order; a
    file beside the folders is no folder, nor is a prefix that never held an object."""
    for k in ("b/deep/1", "a/1", "b/2", "c", "d/x/y/z"):
        store.put_bytes(f"runs/{run}/{k}", k.encode())
    store.put_bytes(f"runs/{run}x/other", b"-")
    assert list(store.list_dirs(f"runs/{run}/")) == [f"runs/{run}/{d}/" for d in ("a", "b", "d")]
    assert list(store.list_dirs(f"runs/{run}/b/")) == [f"runs/{run}/b/deep/"]
    assert f"runs/{run}/" in list(store.list_dirs("runs/")) and f"runs/{run}x/" in list(
        store.list_dirs("runs/")
    )
    store.delete(f"runs/{run}/a/1")  # an emptied folder may stay (SeaweedFS keeps its directory entry)
    assert list(store.list_dirs(f"runs/{run}/"))[-2:] == [f"runs/{run}/{d}/" for d in ("b", "d")]
    assert list(store.list_dirs(f"runs/{run}/nothing/")) == []
    with pytest.raises(ValueError, match="ends with '/'"):
        list(store.list_dirs(f"runs/{run}"))


def test_delete_is_idempotent(store: ObjectStore, run: str) -> None:
    key = f"runs/{run}/gone"
    store.put_bytes(key, b"x")
    store.delete(key)
    store.delete(key)
    assert store.head(key) is None
    assert list(store.list(f"runs/{run}/")) == []


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "dir/"])
def test_unclean_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(StoreConfigError):
        store.put_bytes(key, b"x")


def test_json_helpers(store: ObjectStore, run: str) -> None:
    put_json(store, f"runs/{run}/r.json", {"b": [1, 2], "a": None})
    assert get_json(store, f"runs/{run}/r.json") == {"a": None, "b": [1, 2]}


def test_describe_names_the_store_and_no_secret(store: ObjectStore) -> None:
    text = store.describe()
    assert text
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
    assert not secret or secret not in text


def test_spec_rebuilds_an_equivalent_store(store: ObjectStore, run: str) -> None:
    spec = store_spec(store)
    assert spec is not None and "secret" not in str(spec).lower()
    store.put_bytes(f"runs/{run}/s", b"1")
    assert store_from_spec(spec).get_bytes(f"runs/{run}/s") == b"1"


def test_local_store_rehashes_an_object_changed_behind_its_back(tmp_path: Path) -> None:
    from training.store.local import LocalDirStore

    store = LocalDirStore(tmp_path)
    before = store.put_bytes("runs/x/f", b"aaaa")
    (tmp_path / "runs/x/f").write_bytes(b"aaab")
    after = store.head("runs/x/f")
    assert after is not None and after.etag != before.etag
    assert after.sha256 == hashlib.sha256(b"aaab").hexdigest()
    with pytest.raises(PreconditionFailed):
        store.put_bytes("runs/x/f", b"c", if_match=before.etag)


def test_local_store_hides_unfinished_writes(tmp_path: Path) -> None:
    from training.store.local import LocalDirStore

    store = LocalDirStore(tmp_path)
    (tmp_path / "runs/x").mkdir(parents=True)
    (tmp_path / "runs/x/.tmp-abc").write_bytes(b"partial")
    assert list(store.list("runs/")) == []
