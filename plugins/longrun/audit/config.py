"""The audit's settings: one keyword-only dataclass, checked on construction."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from training.records import schema

_AUDIT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def audit_id_from(text: str) -> str:
    """A store-safe audit id from free text (an Airflow run id, a date): other characters become '-'."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:128]
    return cleaned or "audit"


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditConfig:
    """What one model-checkpoint audit checks and where it writes its report."""

    audit_id: str
    """Names the report: objects go under `<prefix><audit_id>/` in the store (a date or an Airflow run id)."""
    sample_size: int = 16
    """How many stored payload files to download and re-hash against their manifests (0: none)."""
    seed: int = 0
    """Seed of the re-hash sample, so a failing audit can be repeated on the same objects."""
    loss_min: float = 0.0
    """Lowest loss a manifest may record (cross-entropy is never negative)."""
    loss_max: float = 1.0e4
    """Highest loss a manifest may record; a larger one means the run diverged before the save."""
    prefix: str = "audit/"
    """Store prefix of audit reports; outside `runs/`, so the audit never reads its own output."""
    max_report_keys: int = 5
    """How many offending keys the failure message names per property."""
    runs: tuple[str, ...] = ()
    """The runs to audit (their `runs/<run>/` records); empty: every run in the store (the daily audit)."""

    def __post_init__(self) -> None:
        if not isinstance(self.audit_id, str) or not _AUDIT_ID.match(self.audit_id):
            raise ValueError(
                f"AuditConfig.audit_id = {self.audit_id!r}; use 1-128 characters from A-Z a-z 0-9 . _ - "
                "(audit_id_from() cleans a run id)"
            )
        if (
            isinstance(self.sample_size, bool)
            or not isinstance(self.sample_size, int)
            or self.sample_size < 0
        ):
            raise ValueError(f"AuditConfig.sample_size = {self.sample_size!r}; expected an int >= 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"AuditConfig.seed = {self.seed!r}; expected an int")
        for name in ("loss_min", "loss_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"AuditConfig.{name} = {value!r}; expected a finite number")
        if self.loss_min >= self.loss_max:
            raise ValueError(
                f"AuditConfig.loss_min = {self.loss_min!r} must be below loss_max = {self.loss_max!r}"
            )
        if not self.prefix.endswith("/") or self.prefix.startswith("/") or self.prefix.startswith("runs/"):
            raise ValueError(
                f"AuditConfig.prefix = {self.prefix!r}; expected a relative prefix ending in '/', not under runs/"
            )
        if (
            isinstance(self.max_report_keys, bool)
            or not isinstance(self.max_report_keys, int)
            or self.max_report_keys < 1
        ):
            raise ValueError(f"AuditConfig.max_report_keys = {self.max_report_keys!r}; expected an int >= 1")
        if not isinstance(self.runs, tuple):
            raise ValueError(f"AuditConfig.runs = {self.runs!r}; expected a tuple of run names")
        for run in self.runs:
            try:
                schema.check_run_name(run)
            except schema.SchemaError as e:
                raise ValueError(f"AuditConfig.runs has {run!r}: {e}") from None
