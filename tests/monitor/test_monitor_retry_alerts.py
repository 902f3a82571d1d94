"""A monitor retry never drops an alert it has not handed over (issue 10 item 8).

Before: `ignore_existing` passed over every alert already in the store, so an alert that arrived while a
try failed (a store error, a deferral race, a worker crash) was treated as handled by the retry and the
run's incident never started."""

from __future__ import annotations

from pathlib import Path

from longrun.incident import record
from longrun.monitor import watch

from training.records import schema
from training.store.interface import put_json
from training.store.local import LocalDirStore

RUN = "retry-alerts"


def _alert(store: LocalDirStore, step: int, job_id: int | None) -> str:
    alert = schema.record(
        "alert", run=RUN, step=step, check="recompute", suspect_ranks=[1], suspect_nodes=["n2"], evidence={}
    )
    if job_id is not None:
        alert["job_id"] = job_id
    key = schema.store_key(RUN, schema.alert_path(step, "recompute", f"r000-{1700000000 + step}"))
    put_json(store, key, alert)
    return key


def test_a_retry_keeps_this_jobs_unhandled_alert_and_passes_over_the_rest(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "store")
    mine = _alert(store, 20, job_id=7)  # this job's, seen by no incident: must be handed over
    earlier = _alert(store, 10, job_id=5)  # an earlier attempt's job
    taken = _alert(store, 15, job_id=7)  # this job's, but an incident took it already
    record.open_incident(
        store, run=RUN, alert=watch.json.loads(store.get_bytes(taken)), alert_key=taken, mode="act"
    )
    jobless = _alert(store, 12, job_id=None)

    ignored, _ = watch.ignore_existing(store, RUN, [], job_id=7, continuation=False)
    assert mine not in ignored
    assert set(ignored) == {earlier, taken}
    # A relaunch (continuation) also passes over alerts from before alerts carried job ids.
    ignored, _ = watch.ignore_existing(store, RUN, [], job_id=7, continuation=True)
    assert set(ignored) == {earlier, taken, jobless}

    # And the watch then reports it.
    seen = watch.Seen(run=RUN, job_id=7, alerts=ignored)
    assert {k for k in watch.alert_keys(store, RUN) if k not in seen.alerts} == {mine}
