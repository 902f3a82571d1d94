"""The object store: one interface, two implementations (a local directory and any S3 API via boto3).

No torch and no Airflow here, so both sides use it. Keys are '/'-separated and relative to the store root
(the bucket, or the directory). Errors form two families::

    StoreError
    +-- StoreUnavailable      retryable: endpoint down, throttled, 5xx after our own retries
    +-- StoreTerminal         retrying will not help
        +-- NotFound
        +-- PreconditionFailed    a conditional write lost (someone else wrote first / the ETag moved)
        +-- StoreAuthError        wrong or missing credentials, access denied
        +-- StoreConfigError      bad environment (no bucket name, bad directory)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
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


def put_json(store: ObjectStore, key: str, obj: Any, **conditions: Any) -> ObjectInfo:
    data = json.dumps(obj, sort_keys=True, indent=1).encode()
    return store.put_bytes(key, data, **conditions)


def get_json(store: ObjectStore, key: str) -> Any:
    return json.loads(store.get_bytes(key))


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

    def delete(self, key: str) -> None:
        for p in (self._path(key), self._sidecar(key)):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


def store_spec(store: ObjectStore) -> dict[str, Any] | None:
    """A plain description of `store` from which another process can rebuild it (credentials come from
    that process's environment), or None for a store this module does not know."""
    if isinstance(store, LocalDirStore):
        return {"kind": "local", "root": str(store.root)}
    from training.store_sides import SidedStore

    if isinstance(store, SidedStore):
        job, orch = store_spec(store.job), store_spec(store.orchestrator)
        return {"kind": "sided", "job": job, "orchestrator": orch} if job and orch else None
    from training import s3_store  # boto3 only when S3 is used

    if isinstance(store, s3_store.S3Store):
        return {"kind": "s3", **store.spec()}
    return None


def store_from_spec(spec: dict[str, Any]) -> ObjectStore:
    """Rebuild a store from `store_spec`'s description."""
    if spec.get("kind") == "local":
        return LocalDirStore(spec["root"])
    if spec.get("kind") == "s3":
        from training.s3_store import S3Store

        return S3Store(**{k: v for k, v in spec.items() if k != "kind"})
    if (
        spec.get("kind") == "sided"
        and isinstance(spec.get("job"), dict)
        and isinstance(spec.get("orchestrator"), dict)
    ):
        from training.store_sides import SidedStore

        return SidedStore(
            job=store_from_spec(spec["job"]), orchestrator=store_from_spec(spec["orchestrator"])
        )
    raise StoreConfigError(f"store spec {spec!r} has an unknown kind")


def store_from_env(env: dict[str, str] | None = None) -> ObjectStore:
    """The store the environment points at: S3 when AWS_ENDPOINT_URL (or LONGRUN_S3=1 for AWS itself) is
    set, with bucket LONGRUN_BUCKET; otherwise a local directory, LONGRUN_STORE_DIR (default
    ./longrun-store). With LONGRUN_ORCH_BUCKET (S3) or LONGRUN_ORCH_STORE_DIR (local) the orchestrator's
    records live there, apart from the job's (see training.store_sides); without, both share one place."""
    env = dict(os.environ if env is None else env)
    job: ObjectStore
    orch: ObjectStore | None = None
    if env.get("AWS_ENDPOINT_URL") or env.get("LONGRUN_S3") == "1":
        from training.s3_store import S3Store  # boto3 only when S3 is used

        bucket = env.get("LONGRUN_BUCKET", "")
        if not bucket:
            raise StoreConfigError("AWS_ENDPOINT_URL is set but LONGRUN_BUCKET is empty: name the bucket")
        endpoint = env.get("AWS_ENDPOINT_URL") or None
        job = S3Store(bucket=bucket, endpoint_url=endpoint)
        if orch_bucket := env.get("LONGRUN_ORCH_BUCKET"):
            if orch_bucket == bucket:
                raise StoreConfigError(f"LONGRUN_ORCH_BUCKET={orch_bucket!r} must differ from LONGRUN_BUCKET")
            orch = S3Store(bucket=orch_bucket, endpoint_url=endpoint)
    else:
        job = LocalDirStore(env.get("LONGRUN_STORE_DIR", "longrun-store"))
        if orch_dir := env.get("LONGRUN_ORCH_STORE_DIR"):
            orch = LocalDirStore(orch_dir)
    if orch is None:
        return job
    from training.store_sides import SidedStore

    return SidedStore(job=job, orchestrator=orch)
