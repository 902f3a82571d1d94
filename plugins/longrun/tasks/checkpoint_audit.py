"""The body of DAG `checkpoint_audit`'s task: Params in, report keys out, AirflowFailException (no retry)
when the audit found broken properties. A store that does not answer raises StoreUnavailable, which the
task's retries cover. Before the audit (longrun.audit) it closes the incidents whose relaunch stayed
healthy (longrun.incident.closing), so the audit and retention see them closed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Variable
from airflow.sdk.exceptions import AirflowFailException

from longrun.audit.config import AuditConfig, audit_id_from
from longrun.audit.run import AuditFailed, run_audit
from longrun.incident import closing
from longrun.runbooks import runbook_url
from training.store.factory import store_from_env
from training.store.interface import ObjectStore

#: Params of DAG `checkpoint_audit` -> AuditConfig fields.
PARAM_FIELDS = ("sample_size", "seed", "loss_min", "loss_max")


def config_from_params(params: Mapping[str, Any], run_id: str) -> AuditConfig:
    """The audit settings of one DAG run; the report goes under `audit/<cleaned run id>/`."""
    fields = {name: params[name] for name in PARAM_FIELDS if params.get(name) is not None}
    for name in ("loss_min", "loss_max"):
        if name in fields:
            fields[name] = float(fields[name])
    runs = params.get("runs") or []
    if not isinstance(runs, list) or not all(isinstance(r, str) for r in runs):
        raise ValueError(f"Param runs = {runs!r}: expected a list of run names")
    fields["runs"] = tuple(runs)
    return AuditConfig(audit_id=audit_id_from(run_id), **fields)


def closing_threshold(params: Mapping[str, Any]) -> int:
    """Steps a relaunched run must stay healthy before its incident closes: the Param `healthy_steps`,
    else the Variable `longrun_healthy_steps`, else 20. ValueError names the bad setting."""
    if params.get("healthy_steps") is not None:
        return closing.healthy_steps_setting(params["healthy_steps"], source="Param healthy_steps")
    raw = Variable.get(closing.HEALTHY_STEPS_VARIABLE, default=None)
    return closing.healthy_steps_setting(raw, source=f"Variable {closing.HEALTHY_STEPS_VARIABLE}")


def audit_task(params: Mapping[str, Any], run_id: str, store: ObjectStore | None = None) -> dict[str, Any]:
    """Run the audit over the store the environment points at; print where the report is."""
    cfg = config_from_params(params, run_id)
    store = store or store_from_env()
    print(
        f"longrun audit {cfg.audit_id}: auditing {store.describe()} (re-hash sample {cfg.sample_size}, seed {cfg.seed})"
    )
    try:
        healthy_steps = closing_threshold(params)
    except ValueError as e:
        raise AirflowFailException(str(e)) from None
    # Incidents whose relaunch stayed healthy close first, so the audit and retention see them closed.
    for closed in closing.close_all_healthy(store, healthy_steps=healthy_steps):
        print(f"incident {closed}: closed (relaunched and healthy for {healthy_steps} steps)")
    try:
        report = run_audit(store, cfg)
    except AuditFailed as e:
        print(str(e))
        print(f"report keys: {e.report.keys}")
        raise AirflowFailException(str(e)) from e
    print(
        f"model checkpoint audit {cfg.audit_id} passed: {report.rows} rows {report.counts}, {report.rehashed} re-hashed"
    )
    print(f"Data Docs: {report.docs_url} (store key {report.keys['docs']})")
    print(f"Copy the report to open it locally: longrun audit fetch --id {report.audit_id} --dest <dir>")
    print(f"If it fails one day: {runbook_url('audit_failed')}")
    return {"audit_id": report.audit_id, "docs_url": report.docs_url, **report.keys, "counts": report.counts}
