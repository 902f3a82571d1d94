"""S3 implementation of the object store (boto3; any S3-compatible endpoint).

Conditional writes use S3's `If-None-Match: *` / `If-Match: <etag>`, which AWS and SeaweedFS enforce.
The SHA-256 of each object is computed here and kept in its metadata (`x-amz-meta-sha256`), so it is the
same for single-part and multipart uploads (S3's own multipart checksums are composite).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

from training.store.interface import (
    NotFound,
    ObjectInfo,
    PreconditionFailed,
    StoreAuthError,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
    _check_key,
    check_dir_prefix,
    sha256_file,
)

_AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken"}
_MISSING = {"NoSuchKey", "404", "NotFound"}
_RETRYABLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable"}


class S3Store:
    def __init__(
        self,
        *,
        bucket: str,
        endpoint_url: str | None = None,
        max_attempts: int = 6,
        multipart_threshold: int = 64 << 20,
        client: Any = None,
    ) -> None:
        if len(bucket) < 3:
            raise StoreConfigError(f"bucket name {bucket!r} is too short (S3 needs 3-63 characters)")
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.max_attempts = max_attempts
        self.multipart_threshold = multipart_threshold
        # "standard" retry mode backs off exponentially with jitter on throttling and 5xx.
        config = Config(
            retries={"max_attempts": max_attempts, "mode": "standard"}, connect_timeout=5, read_timeout=60
        )
        # A session of its own: boto3's default session caches the credentials it first resolved for the
        # whole process, so a store made later would not see the environment as it is now.
        self._s3 = client or boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        self._transfer = TransferConfig(multipart_threshold=multipart_threshold, multipart_chunksize=16 << 20)

    @property
    def client(self) -> Any:
        """The boto3 S3 client: not tied to this bucket, so a store of another bucket on the same endpoint
        with the same credentials can share it (boto3 clients are thread-safe)."""
        return self._s3

    def spec(self) -> dict[str, Any]:
        """The constructor arguments, for rebuilding this store in another process (no credentials)."""
        return {
            "bucket": self.bucket,
            "endpoint_url": self.endpoint_url,
            "max_attempts": self.max_attempts,
            "multipart_threshold": self.multipart_threshold,
        }

    def describe(self) -> str:
        where = self.endpoint_url or "AWS S3"
        return f"s3://{self.bucket} at {where}"

    def _error(self, e: Exception, what: str) -> StoreError:
        if isinstance(e, S3UploadFailedError):
            inner = e.__cause__ or e.__context__  # boto3's transfer manager wraps the ClientError
            if isinstance(inner, Exception):
                e = inner
        if isinstance(e, NoCredentialsError):
            return StoreAuthError(
                f"{what}: no S3 credentials for {self.describe()} (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
            )
        if isinstance(e, EndpointConnectionError):
            return StoreUnavailable(f"{what}: cannot reach {self.describe()}: {e}")
        if isinstance(e, ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _AUTH_CODES or status == 403:
                return StoreAuthError(
                    f"{what}: {self.describe()} refused the credentials ({code}): check AWS_ACCESS_KEY_ID / "
                    "AWS_SECRET_ACCESS_KEY (`longrun stack env` prints the local stack's)"
                )
            if code == "NoSuchBucket":
                return StoreConfigError(f"{what}: bucket {self.bucket!r} does not exist at {self.describe()}")
            if code in _MISSING or status == 404:
                return NotFound(f"{what}: not found in {self.describe()}")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return PreconditionFailed(f"{what}: condition failed in {self.describe()} ({code})")
            if (status is not None and status >= 500) or code in _RETRYABLE_CODES:
                return StoreUnavailable(f"{what}: {self.describe()} answered {status} {code}")
            return StoreError(f"{what}: {self.describe()} answered {status} {code}: {err.get('Message', '')}")
        if isinstance(e, BotoCoreError):
            return StoreUnavailable(f"{what}: {self.describe()}: {e}")
        return StoreError(f"{what}: {self.describe()}: {e}")

    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> ObjectInfo:
        digest = hashlib.sha256(data).hexdigest()
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": _check_key(key),
            "Body": data,
            "Metadata": {"sha256": digest},
        }
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            resp = self._s3.put_object(**kwargs)
        except Exception as e:
            raise self._error(e, f"put {key}") from None
        return ObjectInfo(key=key, size=len(data), etag=resp["ETag"], sha256=digest)

    def put_file(self, key: str, path: str | os.PathLike[str], *, sha256: str | None = None) -> ObjectInfo:
        digest = sha256 or sha256_file(path)
        try:
            self._s3.upload_file(
                str(path),
                self.bucket,
                _check_key(key),
                ExtraArgs={"Metadata": {"sha256": digest}},
                Config=self._transfer,
            )
        except Exception as e:
            raise self._error(e, f"upload {key}") from None
        info = self.head(key)
        if info is None:
            raise StoreUnavailable(f"upload {key}: object not visible after upload in {self.describe()}")
        return info

    def get_bytes(self, key: str) -> bytes:
        try:
            return bytes(self._s3.get_object(Bucket=self.bucket, Key=_check_key(key))["Body"].read())
        except Exception as e:
            raise self._error(e, f"get {key}") from None

    def download(self, key: str, path: str | os.PathLike[str]) -> None:
        try:
            self._s3.download_file(self.bucket, _check_key(key), str(path), Config=self._transfer)
        except Exception as e:
            raise self._error(e, f"download {key}") from None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            r = self._s3.head_object(Bucket=self.bucket, Key=_check_key(key))
        except Exception as e:
            err = self._error(e, f"head {key}")
            if isinstance(err, NotFound):
                return None
            raise err from None
        return ObjectInfo(
            key=key, size=int(r["ContentLength"]), etag=r["ETag"], sha256=r.get("Metadata", {}).get("sha256")
        )

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        paginator = self._s3.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    # sha256 lives in per-object metadata; callers that need it call head().
                    yield ObjectInfo(key=obj["Key"], size=int(obj["Size"]), etag=obj["ETag"])
        except Exception as e:
            raise self._error(e, f"list {prefix}") from None

    def list_dirs(self, prefix: str) -> Iterator[str]:
        check_dir_prefix(prefix)
        paginator = self._s3.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    yield str(common["Prefix"])
        except Exception as e:
            raise self._error(e, f"list folders {prefix}") from None

    def delete(self, key: str) -> None:
        try:
            self._s3.delete_object(Bucket=self.bucket, Key=_check_key(key))
        except Exception as e:
            raise self._error(e, f"delete {key}") from None
