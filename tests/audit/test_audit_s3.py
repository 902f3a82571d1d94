"""The audit against real S3 (SeaweedFS from the local stack): a bucket of its own, so records other
tests leave in the stack's bucket do not decide this test."""

from __future__ import annotations

import uuid

import pytest
from longrun.audit.config import AuditConfig
from longrun.audit.run import AuditFailed, run_audit

from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import get_json

from .builders import healthy_run, run_with_incident


@pytest.mark.s3
def test_audit_over_seaweedfs(s3_store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(name, s3_store_env[name])
    bucket = f"audit-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_store_env["AWS_ENDPOINT_URL"])
    orch_bucket = f"{bucket}-orchestrator"  # the orchestrator side (audit results) of its own too
    client.create_bucket(Bucket=bucket)
    client.create_bucket(Bucket=orch_bucket)
    try:
        store = store_from_env({**s3_store_env, "LONGRUN_BUCKET": bucket, "LONGRUN_ORCH_BUCKET": orch_bucket})
        healthy_run(store, "alpha")
        run_with_incident(store, "beta")
        report = run_audit(store, AuditConfig(audit_id="s3-good", sample_size=100, seed=3))
        assert report.success and report.rehashed == 6
        assert (
            report.docs_url
            == f"{s3_store_env['AWS_ENDPOINT_URL']}/{orch_bucket}/audit/s3-good/docs/index.html"
        )
        assert store.head("audit/s3-good/docs/index.html") is not None
        assert get_json(store, "audit/s3-good/summary.json")["success"] is True

        # One flipped byte in a stored object, written behind the manifest's back.
        key = schema.store_key("alpha", schema.checkpoint_dir(20) + "model.pt")
        data = bytearray(store.get_bytes(key))
        data[3] ^= 0x80
        store.put_bytes(key, bytes(data))
        with pytest.raises(AuditFailed) as info:
            run_audit(store, AuditConfig(audit_id="s3-flip", sample_size=100, seed=3))
        assert "rehash_matches" in str(info.value) and key in str(info.value)
        assert "runbooks/audit-failed.md" in str(info.value)
    finally:
        for name in (bucket, orch_bucket):
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
                for obj in page.get("Contents", []):
                    client.delete_object(Bucket=name, Key=obj["Key"])
            client.delete_bucket(Bucket=name)
