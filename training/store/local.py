"""The local implementation of the object store: a directory (a laptop, a shared filesystem, the tests)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from training.store.interface import (
    NotFound,
    ObjectInfo,
    PreconditionFailed,
    StoreConfigError,
    _check_key,
    check_dir_prefix,
    sha256_file,
)


class LocalDirStore:
    """A directory as an object store: atomic renames for visibility, a lock file for conditional writes.

    For a laptop, a shared filesystem, and the contract tests. ETags are the SHA-256 of the content. The
    hash of each object is cached in a sidecar under `.longrun-meta/` keyed by (size, mtime, inode), so
    `head` and `list` do not re-read every object; a file changed behind the store's back is re-hashed.
    """

    _META = ".longrun-meta"  # never a valid first key component for our layout

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / self._META / "sha").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreConfigError(f"cannot create local store directory {self.root}: {e}") from e

    def describe(self) -> str:
        return f"local directory {self.root}"

    def _path(self, key: str) -> Path:
        if _check_key(key).split("/")[0] == self._META:
            raise StoreConfigError(f"object key {key!r} is reserved by the local store")
        return self.root / key

    def _sidecar(self, key: str) -> Path:
        return self.root / self._META / "sha" / (key + ".json")

    def _lock(self) -> Any:
        f = open(self.root / self._META / "lock", "a+")
        fcntl.flock(f, fcntl.LOCK_EX)
        return f

    def _remember(self, key: str, p: Path, digest: str) -> None:
        st = p.stat()
        side = self._sidecar(key)
        side.parent.mkdir(parents=True, exist_ok=True)
        # pid and thread: head() may refresh a sidecar from several threads of one process at once.
        tmp = side.with_name(side.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"sha256": digest, "stamp": [st.st_size, st.st_mtime_ns, st.st_ino]}))
        os.replace(tmp, side)

    def _publish(
        self, key: str, write: Any, *, if_none_match: bool, if_match: str | None, digest: str | None = None
    ) -> ObjectInfo:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            digest = digest or sha256_file(tmp)
            with self._lock():
                current = self.head(key)
                if if_none_match and current is not None:
                    raise PreconditionFailed(f"{key} already exists in {self.describe()}")
                if if_match is not None and (current is None or current.etag != if_match):
                    raise PreconditionFailed(f"{key} changed since ETag {if_match} in {self.describe()}")
                os.replace(tmp, dest)
                self._remember(key, dest, digest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return ObjectInfo(key=key, size=dest.stat().st_size, etag=digest, sha256=digest)

    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> ObjectInfo:
        return self._publish(
            key,
            lambda f: f.write(data),
            if_none_match=if_none_match,
            if_match=if_match,
            digest=hashlib.sha256(data).hexdigest(),
        )

    def put_file(self, key: str, path: str | os.PathLike[str], *, sha256: str | None = None) -> ObjectInfo:
        def copy(f: Any) -> None:
            with open(path, "rb") as src:
                while block := src.read(8 << 20):
                    f.write(block)

        return self._publish(key, copy, if_none_match=False, if_match=None, digest=sha256)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise NotFound(f"{key} not found in {self.describe()}") from None

    def download(self, key: str, path: str | os.PathLike[str]) -> None:
        src = self._path(key)
        if not src.is_file():
            raise NotFound(f"{key} not found in {self.describe()}")
        shutil.copyfile(src, path)

    def head(self, key: str) -> ObjectInfo | None:
        p = self._path(key)
        try:
            st = p.stat()
        except FileNotFoundError:
            return None
        if not p.is_file():
            return None
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        try:
            cached = json.loads(self._sidecar(key).read_text())
            digest = cached["sha256"] if cached.get("stamp") == stamp else None
        except (OSError, ValueError, KeyError, TypeError):
            digest = None
        if digest is None:  # written or changed behind the store's back: hash it now
            digest = sha256_file(p)
            self._remember(key, p, digest)
        return ObjectInfo(key=key, size=st.st_size, etag=digest, sha256=digest)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        # Walk only below the deepest directory the prefix names.
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        keys = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != self._META]
            for name in filenames:
                if name.startswith(".tmp-"):
                    continue  # an unfinished write is never visible
                rel = os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/")
                if rel.startswith(prefix):
                    keys.append(rel)
        for key in sorted(keys):
            info = self.head(key)
            if info is not None:
                yield info

    def list_dirs(self, prefix: str) -> Iterator[str]:
        base = self.root / check_dir_prefix(prefix)
        try:
            entries = sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return
        for name in entries:
            if not (prefix == "" and name == self._META) and self._holds_an_object(base / name):
                yield f"{prefix}{name}/"

    @staticmethod
    def _holds_an_object(folder: Path) -> bool:
        """Whether a finished object lies anywhere below `folder` (a folder left empty by deletes, or
        holding only an unfinished write, is no folder to S3 either)."""
        for _dirpath, _dirnames, filenames in os.walk(folder):
            if any(not name.startswith(".tmp-") for name in filenames):
                return True
        return False

    def delete(self, key: str) -> None:
        for p in (self._path(key), self._sidecar(key)):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
