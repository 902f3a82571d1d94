"""The model-checkpoint audit behind DAG `checkpoint_audit` (Great Expectations over the store's records).

from longrun.audit.config import AuditConfig
from longrun.audit.run import run_audit
run_audit(store_from_env(), AuditConfig(audit_id="2026-11-29"))
"""
