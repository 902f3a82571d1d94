"""The audit's Great Expectations run: ephemeral context, pandas data source, whole-dataframe batch, one
suite, one validation definition and one GX Checkpoint that also renders Data Docs.

A GX "Checkpoint" is a validation run; our "model checkpoints" are saved training states. The names stay
apart here: GX objects are called `gx_checkpoint`, the audited ones "model checkpoints".

Each expectation carries `meta["property"]`, a name from PROPERTIES, so a failure message can say in words
which property broke. Great Expectations is imported only when an audit runs (~3 s).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import pandas as pd

from longrun.audit.config import AuditConfig

#: The Data Docs site. An ephemeral context already has `local_site`; ours must have another name.
DOCS_SITE = "longrun_audit"
SUITE = "model_checkpoint_audit"

#: property name -> what it means, in the words a failure message uses.
PROPERTIES: dict[str, str] = {
    "parsable": "every record parses against the schema (unparsable manifest or record)",
    "sha256_wellformed": "manifest file hashes are well-formed SHA-256 (64 lowercase hex)",
    "step_matches_key": "each manifest's step equals the step in its key",
    "steps_increasing": "model checkpoint steps increase per run in save order",
    "promoted_validated": "promoted => validated ok (the promoted model checkpoint exists and its latest "
    "validation passed, of the manifest as it is now)",
    "weight_vote_passed": "weight vote passed at save",
    "no_nan_flag": "no NaN/Inf flag in a manifest",
    "loss_finite": "manifest loss is finite",
    "loss_in_band": "manifest loss within the configured band",
    "promoted_not_suspect": "no promoted model checkpoint inside a suspect interval",
    "rehash_matches": "re-hashed sample of stored objects matches the manifests (flipped byte or missing object)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One property that failed."""

    prop: str
    """Name from PROPERTIES."""
    count: int
    """Rows that broke it."""
    keys: tuple[str, ...]
    """Store keys of (some of) those rows."""

    def describe(self, limit: int) -> str:
        shown = ", ".join(self.keys[:limit]) + (", ..." if len(self.keys) > limit else "")
        return f"{self.prop}: {PROPERTIES[self.prop]} - {self.count} row(s): {shown}"


def import_gx() -> Any:
    """Import Great Expectations. 1.24 imports the deprecated `sre_*` modules; that warning is theirs."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"module 'sre_\w+' is deprecated", category=DeprecationWarning
        )
        import great_expectations as gx
    # GX logs every registration at INFO; in a task log that buries the audit's own lines.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    return gx


def build_expectations(cfg: AuditConfig) -> list[Any]:
    """The audit's expectations, each tagged with the property it checks (PROPERTIES).

    Why one function: it is a table, one GX expectation per property in order, with the row conditions
    they share; splitting it would only scatter the table."""
    gx = import_gx()
    from great_expectations.expectations.row_conditions import Column

    gxe = gx.expectations
    manifest = (Column("kind") == "manifest") & (Column("parsable") == True)  # noqa: E712 (a GX condition)
    promotion = (Column("kind") == "promotion") & (Column("parsable") == True)  # noqa: E712

    def tag(prop: str, exp: Any) -> Any:
        exp.meta = {"property": prop}
        exp.description = PROPERTIES[prop]
        return exp

    return [
        tag("parsable", gxe.ExpectColumnValuesToBeInSet(column="parsable", value_set=[True])),
        tag(
            "sha256_wellformed",
            gxe.ExpectColumnValuesToMatchRegex(
                column="sha256", regex=r"^[0-9a-f]{64}$", row_condition=Column("kind") == "file"
            ),
        ),
        tag(
            "step_matches_key",
            gxe.ExpectColumnValuesToBeInSet(
                column="step_matches_key", value_set=[True], row_condition=manifest
            ),
        ),
        tag(
            "steps_increasing",
            gxe.ExpectColumnValuesToBeInSet(
                column="step_increasing", value_set=[True], row_condition=manifest
            ),
        ),
        tag(
            "promoted_validated",
            gxe.ExpectColumnValuesToBeInSet(
                column="promoted_validated", value_set=[True], row_condition=promotion
            ),
        ),
        tag(
            "weight_vote_passed",
            gxe.ExpectColumnValuesToBeInSet(column="vote_passed", value_set=[True], row_condition=manifest),
        ),
        tag(
            "no_nan_flag",
            gxe.ExpectColumnValuesToBeInSet(column="nan_flag", value_set=[False], row_condition=manifest),
        ),
        tag(
            "loss_finite",
            gxe.ExpectColumnValuesToBeInSet(column="loss_finite", value_set=[True], row_condition=manifest),
        ),
        tag(
            "loss_in_band",
            gxe.ExpectColumnValuesToBeBetween(
                column="loss", min_value=cfg.loss_min, max_value=cfg.loss_max, row_condition=manifest
            ),
        ),
        tag(
            "promoted_not_suspect",
            gxe.ExpectColumnValuesToBeInSet(column="in_suspect", value_set=[False], row_condition=promotion),
        ),
        tag(
            "rehash_matches",
            gxe.ExpectColumnValuesToBeInSet(
                column="rehash_ok",
                value_set=[True],
                row_condition=(Column("kind") == "file") & (Column("rehashed") == True),  # noqa: E712
            ),
        ),
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class GxOutcome:
    """What the GX Checkpoint returned, in plain values."""

    success: bool
    """True when every expectation held."""
    findings: tuple[Finding, ...]
    """The properties that failed, in PROPERTIES order."""
    results: dict[str, Any]
    """The GX Checkpoint result as JSON-ready data (kept next to the Data Docs)."""


def validate_table(table: pd.DataFrame, cfg: AuditConfig, docs_dir: str) -> GxOutcome:
    """Run the suite over `table` through a GX Checkpoint; render Data Docs into `docs_dir`."""
    gx = import_gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    context.add_data_docs_site(
        site_name=DOCS_SITE,
        site_config={
            "class_name": "SiteBuilder",
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": docs_dir},
        },
    )
    batch = (
        context.data_sources.add_pandas("longrun_store")
        .add_dataframe_asset("records")
        .add_batch_definition_whole_dataframe("whole_table")
    )
    suite = context.suites.add(gx.ExpectationSuite(name=SUITE))
    for expectation in build_expectations(cfg):
        suite.add_expectation(expectation)
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=f"{SUITE}_{cfg.audit_id}", data=batch, suite=suite)
    )
    gx_checkpoint = context.checkpoints.add(
        gx.Checkpoint(
            name=f"longrun_audit_{cfg.audit_id}",
            validation_definitions=[definition],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=[DOCS_SITE])],
            result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["key"]},
        )
    )
    result = gx_checkpoint.run(batch_parameters={"dataframe": table})
    findings = []
    for run_result in result.run_results.values():
        for er in run_result.results:
            if er.success:
                continue
            prop = (er.expectation_config.meta or {}).get("property", "unknown")
            unexpected = er.result.get("unexpected_index_list") or []
            keys = tuple(str(u.get("key")) for u in unexpected if isinstance(u, dict))
            findings.append(Finding(prop=prop, count=int(er.result.get("unexpected_count") or 0), keys=keys))
    order = list(PROPERTIES)
    findings.sort(key=lambda f: order.index(f.prop) if f.prop in order else len(order))
    return GxOutcome(success=bool(result.success), findings=tuple(findings), results=result.describe_dict())
