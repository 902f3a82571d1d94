"""One model-checkpoint audit, end to end: read the store into a table, re-hash a sample, validate with
Great Expectations, publish Data Docs and JSON to the store, and raise AuditFailed when a property broke."""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass

from longrun.audit.config import AuditConfig
from longrun.audit.expectations import DOCS_SITE, Finding, validate_table
from longrun.audit.publish import object_url, publish
from longrun.audit.rehash import rehash_sample
from longrun.audit.table import build_table
from longrun.runbooks import runbook_url
from training.store.interface import ObjectStore

log = logging.getLogger(__name__)


class AuditFailed(Exception):
    """The audit ran and found broken properties. The message names each one and links the runbook."""

    def __init__(self, message: str, report: AuditReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditReport:
    """The outcome of one audit."""

    audit_id: str
    """The report's id (its store prefix is `<prefix><audit_id>/`)."""
    success: bool
    """True when every property held."""
    findings: tuple[Finding, ...]
    """Failed properties."""
    rows: int
    """Rows in the audit table."""
    counts: dict[str, int]
    """Rows per kind (manifest, file, validation, promotion, suspect, incident)."""
    rehashed: int
    """Payload files downloaded and re-hashed."""
    keys: dict[str, str]
    """Store keys of the report: docs (index.html), results, table, summary."""
    docs_url: str
    """Link to the Data Docs index."""
    duration_s: float
    """Wall time of the whole audit."""

    def failure_message(self, limit: int = 5) -> str:
        n = len(self.findings)
        lines = [f"model checkpoint audit {self.audit_id} failed {n} propert{'y' if n == 1 else 'ies'}:"]
        lines += [f"  - {f.describe(limit)}" for f in self.findings]
        lines.append(
            f"Data Docs: {self.docs_url} (copy: longrun audit fetch --id {self.audit_id} --dest <dir>)"
        )
        lines.append(f"Runbook: {runbook_url('audit_failed')}")
        return "\n".join(lines)


def run_audit(store: ObjectStore, cfg: AuditConfig) -> AuditReport:
    """Audit every run in `store` (or `cfg.runs`). Raises AuditFailed (after publishing the report) when a
    property broke."""
    started = time.monotonic()
    table = build_table(store, cfg.runs, cache=True)
    rehashed = rehash_sample(store, table, sample_size=cfg.sample_size, seed=cfg.seed)
    prefix = f"{cfg.prefix}{cfg.audit_id}/"
    with tempfile.TemporaryDirectory(prefix="longrun-audit-docs-") as docs_dir:
        outcome = validate_table(table, cfg, docs_dir)
        counts = {str(k): int(v) for k, v in table["kind"].value_counts().sort_index().items()}
        summary = {
            "audit_id": cfg.audit_id,
            "success": outcome.success,
            "findings": [
                {"property": f.prop, "count": f.count, "keys": list(f.keys)} for f in outcome.findings
            ],
            "rows": len(table),
            "counts": counts,
            "rehashed": rehashed,
            "sample_size": cfg.sample_size,
            "seed": cfg.seed,
            "runs": list(cfg.runs),
            "loss_band": [cfg.loss_min, cfg.loss_max],
            "docs_site": DOCS_SITE,
            "time": time.time(),
        }
        keys = publish(
            store,
            prefix=prefix,
            docs_dir=docs_dir,
            results=outcome.results,
            summary=summary,
            table_csv=table.to_csv(index=False).encode(),
        )
    report = AuditReport(
        audit_id=cfg.audit_id,
        success=outcome.success,
        findings=outcome.findings,
        rows=len(table),
        counts=counts,
        rehashed=rehashed,
        keys=keys,
        docs_url=object_url(store, keys["docs"]),
        duration_s=time.monotonic() - started,
    )
    log.info(
        "model checkpoint audit %s: %d rows %s, %d re-hashed, %s in %.1f s; Data Docs: %s (key %s)",
        cfg.audit_id,
        report.rows,
        counts,
        rehashed,
        "passed" if report.success else "FAILED",
        report.duration_s,
        report.docs_url,
        keys["docs"],
    )
    if not report.success:
        raise AuditFailed(report.failure_message(cfg.max_report_keys), report)
    return report
