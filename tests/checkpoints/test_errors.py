"""Error families: how S3 answers map to retryable / terminal store errors, and the saver's retry loop.

These build botocore's exception objects directly (no server): the classification is a pure function.
"""

from __future__ import annotations

import time

import pytest
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from training.checkpoint.upload import with_retries
from training.store.interface import (
    NotFound,
    PreconditionFailed,
    StoreAuthError,
    StoreConfigError,
    StoreUnavailable,
)
from training.store.s3 import S3Store


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
    )


@pytest.mark.parametrize(
    ("error", "family"),
    [
        (_client_error("SlowDown", 503), StoreUnavailable),
        (_client_error("InternalError", 500), StoreUnavailable),
        (_client_error("RequestTimeout", 400), StoreUnavailable),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), StoreUnavailable),
        (_client_error("SignatureDoesNotMatch", 403), StoreAuthError),
        (_client_error("InvalidAccessKeyId", 403), StoreAuthError),
        (NoCredentialsError(), StoreAuthError),
        (_client_error("NoSuchKey", 404), NotFound),
        (_client_error("NoSuchBucket", 404), StoreConfigError),
        (_client_error("PreconditionFailed", 412), PreconditionFailed),
    ],
)
def test_s3_errors_map_to_the_store_families(error: Exception, family: type) -> None:
    store = S3Store(bucket="bucket", endpoint_url="http://127.0.0.1:1")
    mapped = store._error(error, "put k")
    assert type(mapped) is family, mapped
    assert str(mapped).startswith("put k") and "127.0.0.1:1" in str(mapped)


def test_an_upload_failure_is_classified_by_the_error_inside_it() -> None:
    store = S3Store(bucket="bucket", endpoint_url="http://127.0.0.1:1")
    try:
        try:
            raise _client_error("SignatureDoesNotMatch", 403)
        except ClientError:
            raise S3UploadFailedError("Failed to upload x") from None
    except S3UploadFailedError as wrapped:
        wrapped.__context__ = _client_error("SignatureDoesNotMatch", 403)
        assert isinstance(store._error(wrapped, "upload k"), StoreAuthError)


def test_with_retries_backs_off_then_succeeds() -> None:
    calls = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise StoreUnavailable("503")
        return "ok"

    assert with_retries(flaky, what="put k", deadline_s=10) == "ok"
    # Back-off 0.25 s, then 0.5 s: sleeps are lower bounds on any machine, however loaded.
    assert len(calls) == 3 and calls[1] - calls[0] >= 0.25 and calls[2] - calls[1] >= 0.5


def test_with_retries_gives_up_at_the_deadline_and_says_so() -> None:
    def down() -> None:
        raise StoreUnavailable("cannot reach s3://b at http://127.0.0.1:1")

    with pytest.raises(
        StoreUnavailable, match=r"put k: gave up after \d+ attempts over .*127\.0\.0\.1:1"
    ) as exc:
        with_retries(down, what="put k", deadline_s=1.0)
    # It stops before a sleep would cross the deadline: 0 + 0.25 + 0.5 <= 1.0 allows at most 3 attempts
    # (a loaded machine makes fewer, never more), instead of a wall-clock bound that load breaks.
    attempts = int(str(exc.value).split("gave up after ")[1].split()[0])
    assert 1 <= attempts <= 3, exc.value


def test_with_retries_does_not_retry_terminal_errors() -> None:
    calls = []

    def denied() -> None:
        calls.append(1)
        raise StoreAuthError("denied")

    with pytest.raises(StoreAuthError):
        with_retries(denied, what="put k", deadline_s=10)
    assert calls == [1]
