"""The audit table: one row per record in the store (all runs), with the derived columns the expectations
check. Pure pandas: no Great Expectations here, so the table can be inspected and tested on its own.

Row kinds: `manifest` (one per model checkpoint), `file` (one per payload file a manifest lists),
`validation`, `promotion` (the history and the current pointer), `suspect`, `incident`. A record that does
not parse against training.records.schema is still a row, with `parsable` False and the reason in `error`: a
broken manifest is a finding, not a crash.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import pandas as pd

from longrun.audit.reader import read_records
from longrun.health.history import PREFIX, NodeEvent
from training.records import schema
from training.records.job import FileEntry
from training.store.interface import ObjectStore

#: The table's columns in order; every row has every column (None/NaN where it does not apply).
COLUMNS = (
    "kind",
    "run",
    "key",
    "step",
    "parsable",
    "error",
    "time",
    # manifest
    "loss",
    "loss_finite",
    "nan_flag",
    "vote_passed",
    "step_matches_key",
    "step_increasing",
    # file
    "sha256",
    "size",
    "rehashed",
    "rehash_ok",
    "rehash_error",
    # validation
    "ok",
    # promotion
    "seq",
    "manifest_key",
    "current",
    "promoted_validated",
    "in_suspect",
    # suspect
    "after_step",
    "until_step",
    # incident
    "incident_id",
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def vote_passed(weight_vote: Any) -> bool:
    """Whether a manifest's weight-vote result says the replicas agreed at save time.

    The trainer records the vote's verdict (`verdict: "pass"`); `passed`/`ok` booleans are read too.
    Anything else, an empty dict included, is not a pass: a checkpoint saved without a vote is unvouched.
    """
    if not isinstance(weight_vote, dict):
        return False
    if "verdict" in weight_vote:
        return weight_vote["verdict"] == "pass"
    for name in ("passed", "ok"):
        if name in weight_vote:
            return weight_vote[name] is True
    return False


def nan_flag(manifest: dict[str, Any]) -> bool:
    """Whether the manifest itself says some saved tensor or the loss was NaN/Inf."""
    for name in ("nan", "has_nan", "nonfinite", "has_nonfinite"):
        if manifest.get(name):
            return True
    if manifest.get("finite") is False:
        return True
    loss = manifest.get("loss")
    return isinstance(loss, float) and math.isnan(loss)


def _file_key(run: str, step: int, entry: Any) -> str:
    f = FileEntry.shown(entry)
    if f.key is not None:
        rel = f.key
    elif f.name is not None:
        rel = schema.checkpoint_dir(step) + f.name
    else:
        return ""
    return rel if rel.startswith("runs/") else schema.run_prefix(run) + rel


def _row(kind: str, run: str, key: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(kind=kind, run=run, key=key, parsable=True)
    row.update(fields)
    return row


def _manifest_rows(run: str, key: str, obj: dict[str, Any], time_: float | None) -> list[dict[str, Any]]:
    """A manifest's row, then one `file` row per entry of its file list."""
    loss = _number(obj["loss"])
    rows = [
        _row(
            "manifest",
            run,
            key,
            step=obj["step"],
            time=time_,
            loss=loss,
            loss_finite=loss is not None and math.isfinite(loss),
            nan_flag=nan_flag(obj),
            vote_passed=vote_passed(obj["weight_vote"]),
            step_matches_key=obj["step"] == schema.step_of_manifest_key(key),
        )
    ]
    for i, entry in enumerate(obj["files"]):
        f = FileEntry.shown(entry)
        rows.append(
            _row(
                "file",
                run,
                # An entry naming no object is still reported, by its place in the manifest.
                _file_key(run, obj["step"], entry) or f"{key}#files[{i}]",
                step=obj["step"],
                sha256=f.sha256 if f.sha256 is not None else "",
                size=f.size,
                rehashed=False,
                manifest_key=key,
            )
        )
    return rows


def _suspect_until(obj: dict[str, Any]) -> float:
    """The last step a suspect mark covers (`until_step`, else the alert's step); inf when it names none."""
    until_n = _number(obj.get("until_step", obj.get("alert_step")))
    return until_n if until_n is not None else math.inf


def _suspect_row(run: str, key: str, obj: dict[str, Any], time_: float | None) -> dict[str, Any]:
    until_f = _suspect_until(obj)
    return _row(
        "suspect",
        run,
        key,
        time=time_,
        after_step=obj["after_step"],
        until_step=None if until_f == math.inf else int(until_f),
    )


def _judge_promotions(
    promotions: list[tuple[dict[str, Any], dict[str, Any]]],
    manifests: dict[str, dict[str, Any]],
    etags: dict[str, str],
    validations: dict[tuple[str, int], list[tuple[float, bool, str | None]]],
    suspects: dict[str, list[tuple[int, float, float]]],
) -> None:
    """Fill each promotion row's `promoted_validated` and `in_suspect`, once every record has been read."""
    for row, obj in promotions:
        if not row["current"] and obj["manifest_key"] not in etags:
            # Retention deleted this once-promoted model checkpoint; its history entry stays and vouches
            # for nothing any more. The pointer itself must always name a present, validated one.
            row["promoted_validated"] = None
        else:
            row["promoted_validated"] = _latest_ok(
                validations.get((row["run"], row["step"]), []), etags.get(obj["manifest_key"])
            )
        row["in_suspect"] = _promotion_in_suspect(row, obj, manifests, suspects.get(row["run"], []))


def build_table(store: ObjectStore, runs: Iterable[str] = (), *, cache: bool = False) -> pd.DataFrame:
    """Read every manifest, validation, promotion, suspect and incident record in `store` (of the named
    `runs`, else of every run) into one table. `cache`: through the audit's record cache (reader.py), so
    only records new or changed since the last audit are read from the store; the table is the same."""
    rows: list[dict[str, Any]] = []
    manifests: dict[str, dict[str, Any]] = {}  # key -> record
    etags: dict[str, str] = {}  # manifest key -> its ETag now
    # (run, step) -> [(time, ok, the manifest ETag it validated, when recorded)]
    validations: dict[tuple[str, int], list[tuple[float, bool, str | None]]] = defaultdict(list)
    suspects: dict[str, list[tuple[int, float, float]]] = defaultdict(list)  # run -> (after, until, time)
    promotions: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (row, record)
    for kind, run, info, obj, error in read_records(store, runs, cache=cache):
        key = info.key
        if obj is None:
            step = schema.step_of_manifest_key(key) if kind == "manifest" else None
            rows.append(_row(kind, run, key, step=step, parsable=False, error=error))
            continue
        time_ = _number(obj.get("time"))
        if kind == "manifest":
            manifests[key] = obj
            etags[key] = info.etag
            rows.extend(_manifest_rows(run, key, obj, time_))
        elif kind == "validation":
            etag = obj.get("manifest_etag")
            validations[(run, obj["step"])].append(
                (time_ or 0.0, obj["ok"], etag if isinstance(etag, str) else None)
            )
            rows.append(_row(kind, run, key, step=obj["step"], time=time_, ok=obj["ok"]))
        elif kind == "promotion":
            row = _row(
                kind,
                run,
                key,
                step=obj["step"],
                time=time_,
                seq=obj["seq"],
                manifest_key=obj["manifest_key"],
                current=key.endswith("/" + schema.PROMOTED_POINTER_PATH),
            )
            rows.append(row)
            promotions.append((row, obj))
        elif kind == "suspect":
            suspects[run].append((obj["after_step"], _suspect_until(obj), time_ or 0.0))
            rows.append(_suspect_row(run, key, obj, time_))
        else:  # incident
            rows.append(_row(kind, run, key, time=time_, incident_id=obj["incident_id"]))

    rows.extend(node_event_rows(store))
    _mark_step_order(rows)
    _judge_promotions(promotions, manifests, etags, validations, suspects)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    # NaN, not None, for absent numbers: GX's between-expectations skip nulls, and loss_finite catches them.
    table["loss"] = pd.to_numeric(table["loss"], errors="coerce").astype("float64")
    return table


def node_event_rows(store: ObjectStore) -> list[dict[str, Any]]:
    """One `node_event` row per node-history record (nodes/<node>/...): it must parse as a NodeEvent and
    lie under its own node's folder; otherwise `parsable` is False with the reason."""
    rows = []
    for info in store.list(PREFIX):
        folder = info.key[len(PREFIX) :].split("/", 1)[0]
        try:
            ev = NodeEvent.from_json(json.loads(store.get_bytes(info.key)))
            if ev.node != folder:
                raise ValueError(f"record names node {ev.node!r} but lies under {PREFIX}{folder}/")
        except ValueError as e:
            rows.append(_row("node_event", "", info.key, parsable=False, error=f"{type(e).__name__}: {e}"))
            continue
        rows.append(_row("node_event", ev.run or "", info.key, time=ev.time, incident_id=ev.incident_id))
    return rows


def _mark_step_order(rows: list[dict[str, Any]]) -> None:
    """Per run, in save-time order, every manifest's step must exceed every step saved before it."""
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["kind"] == "manifest" and row["parsable"]:
            by_run[row["run"]].append(row)
    for run_rows in by_run.values():
        highest: int | None = None
        for row in sorted(run_rows, key=lambda r: (r["time"] or 0.0, r["key"])):
            row["step_increasing"] = highest is None or row["step"] > highest
            highest = row["step"] if highest is None else max(highest, row["step"])


def _latest_ok(attempts: list[tuple[float, bool, str | None]], manifest_etag: str | None) -> bool:
    """A promoted model checkpoint must be vouched for by its latest validation (a later failed
    re-validation, e.g. bit rot found, withdraws the vouch), and that validation must be of the manifest
    as it is now (when the record names the manifest's ETag, as longrun's validator does)."""
    if not attempts or manifest_etag is None:
        return False  # never validated, or the manifest is gone
    _time, ok, validated_etag = max(attempts, key=lambda a: a[0])
    if validated_etag is not None and validated_etag != manifest_etag:
        return False
    return ok is True


def _promotion_in_suspect(
    row: dict[str, Any],
    promotion: dict[str, Any],
    manifests: dict[str, dict[str, Any]],
    suspects: list[tuple[int, float, float]],
) -> bool:
    """A promotion points into a suspect interval when the model checkpoint it names was saved before the
    interval was declared (so it is the suspect one, not a re-save by the relaunched job) and the promotion
    is still current or was made after the declaration. Promotions made before anyone knew are history."""
    step = row["step"]
    manifest = manifests.get(promotion["manifest_key"])
    saved = _number(manifest["time"]) if manifest else None
    for after, until, declared in suspects:
        if not (after < step <= until):
            continue
        if saved is not None and saved > declared:
            continue  # re-saved by the relaunched job after the demotion
        if row["current"] or (row["time"] or 0.0) >= declared:
            return True
    return False
