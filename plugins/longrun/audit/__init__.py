"""The model-checkpoint audit behind DAG `checkpoint_audit` (Great Expectations over the store's records).

from longrun.audit import AuditConfig, run_audit
run_audit(store_from_env(), AuditConfig(audit_id="2026-11-29"))
"""

from longrun.audit.config import AuditConfig, audit_id_from
from longrun.audit.run import AuditFailed, AuditReport, run_audit

__all__ = ["AuditConfig", "AuditFailed", "AuditReport", "audit_id_from", "run_audit"]
