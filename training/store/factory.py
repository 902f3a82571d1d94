"""The object store: one interface, two implementations (a local directory and any S3 API via boto3).

No torch and no Airflow here, so both sides use it. Import the store's names from here: the interface and
its two error families (defined in `training.store.interface`), the local directory (`training.store.local`),
and the choice of a store from the environment or from a spec (this module). The S3 store
(`training.store.s3`) is imported only when used.
"""

from __future__ import annotations

import os
from typing import Any

from training.store.interface import (
    ObjectStore,
    StoreConfigError,
)
from training.store.local import LocalDirStore

__all__ = ["store_from_env", "store_from_spec", "store_spec"]


def store_spec(store: ObjectStore) -> dict[str, Any] | None:
    """A plain description of `store` from which another process can rebuild it (credentials come from
    that process's environment), or None for a store this module does not know."""
    if isinstance(store, LocalDirStore):
        return {"kind": "local", "root": str(store.root)}
    from training.store.sides import SidedStore

    if isinstance(store, SidedStore):
        job, orch = store_spec(store.job), store_spec(store.orchestrator)
        return {"kind": "sided", "job": job, "orchestrator": orch} if job and orch else None
    from training.store import s3 as s3_store  # boto3 only when S3 is used

    if isinstance(store, s3_store.S3Store):
        return {"kind": "s3", **store.spec()}
    return None


def store_from_spec(spec: dict[str, Any]) -> ObjectStore:
    """Rebuild a store from `store_spec`'s description."""
    if spec.get("kind") == "local":
        return LocalDirStore(spec["root"])
    if spec.get("kind") == "s3":
        from training.store.s3 import S3Store

        return S3Store(**{k: v for k, v in spec.items() if k != "kind"})
    if (
        spec.get("kind") == "sided"
        and isinstance(spec.get("job"), dict)
        and isinstance(spec.get("orchestrator"), dict)
    ):
        from training.store.sides import SidedStore

        return SidedStore(
            job=store_from_spec(spec["job"]), orchestrator=store_from_spec(spec["orchestrator"])
        )
    raise StoreConfigError(f"store spec {spec!r} has an unknown kind")


def store_from_env(env: dict[str, str] | None = None) -> ObjectStore:
    """The store the environment points at: S3 when AWS_ENDPOINT_URL (or LONGRUN_S3=1 for AWS itself) is
    set, with bucket LONGRUN_BUCKET; otherwise a local directory, LONGRUN_STORE_DIR (default
    ./longrun-store). With LONGRUN_ORCH_BUCKET (S3) or LONGRUN_ORCH_STORE_DIR (local) the orchestrator's
    records live there, apart from the job's (see training.store.sides); without, both share one place."""
    env = dict(os.environ if env is None else env)
    job: ObjectStore
    orch: ObjectStore | None = None
    if env.get("AWS_ENDPOINT_URL") or env.get("LONGRUN_S3") == "1":
        from training.store.s3 import S3Store  # boto3 only when S3 is used

        bucket = env.get("LONGRUN_BUCKET", "")
        if not bucket:
            raise StoreConfigError("AWS_ENDPOINT_URL is set but LONGRUN_BUCKET is empty: name the bucket")
        endpoint = env.get("AWS_ENDPOINT_URL") or None
        job = S3Store(bucket=bucket, endpoint_url=endpoint)
        if orch_bucket := env.get("LONGRUN_ORCH_BUCKET"):
            if orch_bucket == bucket:
                raise StoreConfigError(f"LONGRUN_ORCH_BUCKET={orch_bucket!r} must differ from LONGRUN_BUCKET")
            # One client for both buckets (same endpoint, same credentials): building one costs ~0.1 s
            # of CPU, paid by every task on the incident's path.
            orch = S3Store(bucket=orch_bucket, endpoint_url=endpoint, client=job.client)
    else:
        job = LocalDirStore(env.get("LONGRUN_STORE_DIR", "longrun-store"))
        if orch_dir := env.get("LONGRUN_ORCH_STORE_DIR"):
            orch = LocalDirStore(orch_dir)
    if orch is None:
        return job
    from training.store.sides import SidedStore

    return SidedStore(job=job, orchestrator=orch)
