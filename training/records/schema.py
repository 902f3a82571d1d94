"""Record schemas and the store key layout, shared by the job (`training`) and the orchestrator (`longrun`).

Pure Python on purpose: no torch, no Airflow, no boto3. Both sides import it, so a record written by the
trainer is read by the DAGs with the same field names and the same key layout.

Every record is a JSON object with `schema_version` and `kind`. Readers accept records whose major
version they know and ignore fields they do not know, so the trainer can add evidence without breaking an
older orchestrator. Layout under a run (the same relative paths in the local run dir and in the store,
where the store prefixes them with ``runs/<run>/``)::

    alerts/<step>-<check>-<id>.json          one per SDC verdict (the orchestrator's trigger)
    checks/<first>-<last>-<rank>.jsonl       check results, passes too, flushed in batches
    progress/latest.json                     heartbeat: step, loss, step time, wall time
    checkpoints/step-<step>/<files>          checkpoint payload
    checkpoints/step-<step>/manifest.json    written last: no manifest, no checkpoint
    saves/step-<step>.json                   outcome of each background save (failures too)
    validations/step-<step>-<id>.json        one per validation attempt
    promoted/current.json                    pointer to the promoted checkpoint (conditional write)
    promoted/history/<seq>.json              every promotion, in order
    suspect/<id>.json                        demotions: steps after the last known-good step
    picks/<alert step>-<id>.json             each pre-incident checkpoint choice, with why
    incidents/<id>.json                      incident records
    report.json                              the run report (`final_fingerprint`)
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

SCHEMA_VERSION = 1

#: The exit code of a process that reached an SDC verdict: "do not restart in place". It is the number
#: NVRx 0.5+ reserves for "do not restart"; the orchestrator reads the alert record for the why.
EXIT_SDC_VERDICT = 93

#: Every Slurm drain reason longrun writes starts with this; longrun resumes only nodes whose reason does.
DRAIN_PREFIX = "longrun:"

CHECKS = ("finite", "recompute", "weight_vote")
FAULT_KINDS = ("nan", "inf", "scale", "weight-flip", "sick-node", "crash", "hang")
INCIDENT_MODES = ("act", "approve", "observe")
#: Model presets the reference trainer knows (training.config defines them; listed here for validation).
MODEL_PRESETS = ("tiny", "small")

#: The checks that can see a FINITE wrong value. Any fault may have produced finite wrong values before
#: it was caught (a node emits wrong numbers before it emits a NaN), so every alert's pick is bounded by
#: these too, not by the check that fired alone.
FINITE_VALUE_CHECKS = ("recompute", "weight_vote")

# The checks whose last all-rank pass bounds the pre-incident pick, per alert check: the check that
# fired and every check able to see a finite wrong value.
CHECKS_FOR_ALERT = {c: tuple(dict.fromkeys((c, *FINITE_VALUE_CHECKS))) for c in CHECKS}

_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: A Slurm node (or partition) name as longrun accepts it from a conf, a directive or a fault spec.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


class SchemaError(ValueError):
    """A record or a name does not match the schema. The message names the field and the bad value."""


def check_run_name(run: str) -> str:
    """Return `run` if it is a safe run name (used in store keys, paths and Slurm job names)."""
    if not isinstance(run, str) or not _RUN_NAME.match(run) or ".." in run:
        raise SchemaError(
            f"run name {run!r} is invalid: use 1-64 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit"
        )
    return run


# ---- key layout (relative to the run) -------------------------------------------------------------


def run_prefix(run: str) -> str:
    return f"runs/{check_run_name(run)}/"


def store_key(run: str, relative: str) -> str:
    """The store key of a path relative to the run."""
    if relative.startswith("/") or ".." in relative.split("/"):
        raise SchemaError(f"relative key {relative!r} must not be absolute or contain '..'")
    return run_prefix(run) + relative


def alert_path(step: int, check: str, ident: str) -> str:
    return f"alerts/{step:08d}-{check}-{ident}.json"


#: A check batch covers at most this many consecutive steps (last - first + 1). The writer splits what it
#: has pending into batches no longer than this, and a reader takes a batch whose key says more, or a
#: record outside the steps its key names, for no evidence. The bound is what lets the pick list and read
#: only the batches near an alert (longrun.checkpoints.pick), however old the run is.
CHECK_BATCH_MAX_SPAN = 100
#: Batch keys are listed in windows of this many steps of their first step (a power of ten: the window is
#: a key prefix, `checks/<the first 6 of the first step's 8 digits>`).
CHECK_BATCH_WINDOW = 100
#: Steps from here on no longer fit the key's 8 digits, and the key windows no longer sort; a reader then
#: lists every batch.
CHECK_BATCH_STEP_LIMIT = 10**8
_CHECK_BATCH = re.compile(r"checks/(\d{8})-(\d{8})-r(\d{3,})\.jsonl$")


def check_batch_path(first_step: int, last_step: int, rank: int) -> str:
    return f"checks/{first_step:08d}-{last_step:08d}-r{rank:03d}.jsonl"


def parse_check_batch_path(relative: str) -> tuple[int, int, int] | None:
    """(first step, last step, rank) of a check batch's relative key (the key may carry the run's prefix);
    None when it is not one, or when it names more than CHECK_BATCH_MAX_SPAN steps (no evidence)."""
    m = _CHECK_BATCH.search(relative)
    if m is None or not (relative == m.group(0) or relative.endswith("/" + m.group(0))):
        return None
    first, last, rank = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if last < first or last - first + 1 > CHECK_BATCH_MAX_SPAN:
        return None
    return first, last, rank


def check_batch_window_prefix(step: int) -> str:
    """The relative key prefix of every batch whose first step lies in `step`'s window of
    CHECK_BATCH_WINDOW steps (steps below CHECK_BATCH_STEP_LIMIT)."""
    if not 0 <= step < CHECK_BATCH_STEP_LIMIT:
        raise ValueError(f"step {step}: check batch windows cover steps 0 to {CHECK_BATCH_STEP_LIMIT - 1}")
    # A window of 10^k steps is the batches whose 8-digit first step shares its leading 8 - k digits.
    kept_digits = 8 - (len(str(CHECK_BATCH_WINDOW)) - 1)
    return f"checks/{step:08d}"[: len("checks/") + kept_digits]


PROGRESS_PATH = "progress/latest.json"
PROMOTED_POINTER_PATH = "promoted/current.json"
REPORT_PATH = "report.json"


def checkpoint_dir(step: int) -> str:
    return f"checkpoints/step-{step:08d}/"


def manifest_path(step: int) -> str:
    return checkpoint_dir(step) + "manifest.json"


def save_path(step: int) -> str:
    return f"saves/step-{step:08d}.json"


def pick_path(alert_step: int, ident: str) -> str:
    return f"picks/{alert_step:08d}-{ident}.json"


def validation_path(step: int, ident: str) -> str:
    return f"validations/step-{step:08d}-{ident}.json"


def promotion_history_path(seq: int) -> str:
    return f"promoted/history/{seq:06d}.json"


#: One object per step ever promoted, named by the step, so a reader lists the promoted steps instead of
#: reading every history entry (`promoted_step_path`; the pointer says whether the run keeps them).
PROMOTED_STEPS_DIR = "promoted/steps/"
_PROMOTED_STEP = re.compile(r"promoted/steps/(\d{8})\.json$")


def promoted_step_path(step: int) -> str:
    return f"{PROMOTED_STEPS_DIR}{step:08d}.json"


def step_of_promoted_key(key: str) -> int | None:
    """The step a `promoted_step_path` key (relative or full) names, or None for any other key."""
    m = _PROMOTED_STEP.search(key)
    return int(m.group(1)) if m else None


def suspect_path(ident: str) -> str:
    return f"suspect/{ident}.json"


def incident_path(ident: str) -> str:
    return f"incidents/{ident}.json"


def incident_id_for(alert_key: str) -> str:
    """The incident id of an alert: its key's file stem (`00000017-recompute-r000-1764430000`), so an alert
    has one incident record (`incident_path`) and one `sdc_incident` run whoever hands it over."""
    name = PurePosixPath(alert_key).name
    stem = name[: -len(".json")]
    if not name.endswith(".json") or not stem or stem.startswith("."):
        raise ValueError(f"alert_key={alert_key!r} does not name an alert record")
    return stem


_STEP_DIR = re.compile(r"checkpoints/step-(\d{8})/manifest\.json$")


def step_of_manifest_key(key: str) -> int | None:
    """The step of a manifest key (relative or full), or None if the key is not a manifest."""
    m = _STEP_DIR.search(key)
    return int(m.group(1)) if m else None


# ---- records --------------------------------------------------------------------------------------

#: kind -> {field: type or tuple of types}; these are the fields every reader may rely on (the kinds of
#: `training.records.base.Record`, whose `FIELDS` take them from here: `fields.schema_fields`).
REQUIRED: dict[str, dict[str, Any]] = {
    "alert": {
        "run": str,
        "step": int,
        "check": str,
        "suspect_ranks": list,
        "suspect_nodes": list,
        "evidence": dict,
        "time": (int, float),
    },
    "check": {"run": str, "step": int, "check": str, "verdict": str, "rank": int, "duration_s": (int, float)},
    "progress": {
        "run": str,
        "step": int,
        "loss": (int, float, type(None)),
        "step_time_s": (int, float),
        "time": (int, float),
    },
    "manifest": {
        "run": str,
        "step": int,
        "time": (int, float),
        "files": list,
        "fingerprints": dict,
        "weight_vote": dict,
        "coverage": dict,
        "loss": (int, float, type(None)),
        "code_version": str,
        "world": dict,
    },
    "validation": {"run": str, "step": int, "ok": bool, "errors": list, "time": (int, float)},
    # The outcome of one background checkpoint save (written by the saver; failures too).
    "save": {"run": str, "step": int, "ok": bool, "error": (str, type(None)), "time": (int, float)},
    # The pre-incident checkpoint choice and why (step None: nothing is provably from before the fault).
    "pick": {"run": str, "alert": dict, "step": (int, type(None)), "why": str, "time": (int, float)},
    "promotion": {"run": str, "step": int, "manifest_key": str, "time": (int, float), "seq": int},
    "suspect": {"run": str, "after_step": int, "reason": str, "time": (int, float)},
    "incident": {"run": str, "incident_id": str, "alert": dict, "timeline": list, "mode": str},
    "report": {"run": str, "final_step": int, "final_fingerprint": str, "time": (int, float)},
}

VERDICTS = ("pass", "fail", "skip")


def record(kind: str, **fields: Any) -> dict[str, Any]:
    """Build a record of `kind`, stamped with the schema version (and time, if the caller gave none)."""
    obj: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "kind": kind}
    if "time" in REQUIRED.get(kind, {}) and "time" not in fields:
        fields["time"] = time.time()
    obj.update(fields)
    validate(kind, obj)
    return obj


def validate(kind: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """Raise SchemaError unless `obj` is a record of `kind` this version can read."""
    if kind not in REQUIRED:
        raise SchemaError(f"unknown record kind {kind!r}; known: {sorted(REQUIRED)}")
    if not isinstance(obj, Mapping):
        raise SchemaError(f"{kind} record must be a JSON object, got {type(obj).__name__}")
    version = obj.get("schema_version")
    if not isinstance(version, int) or version < 1 or version > SCHEMA_VERSION:
        raise SchemaError(
            f"{kind} record has schema_version {version!r}; this reader knows 1..{SCHEMA_VERSION}"
        )
    for field, typ in REQUIRED[kind].items():
        if field not in obj:
            raise SchemaError(f"{kind} record lacks field {field!r}")
        value = obj[field]
        # bool is an int in Python; a step of True is still a bug.
        if (
            isinstance(value, bool)
            and typ is not bool
            and bool not in (typ if isinstance(typ, tuple) else (typ,))
        ):
            raise SchemaError(f"{kind} record field {field!r} = {value!r} has the wrong type")
        if not isinstance(value, typ):
            raise SchemaError(f"{kind} record field {field!r} = {value!r:.80} has the wrong type")
    if "check" in REQUIRED[kind] and obj["check"] not in CHECKS:
        raise SchemaError(f"{kind} record field 'check' = {obj['check']!r}; expected one of {CHECKS}")
    if kind == "check" and obj["verdict"] not in VERDICTS:
        raise SchemaError(f"check record field 'verdict' = {obj['verdict']!r}; expected one of {VERDICTS}")
    if kind == "incident" and obj["mode"] not in INCIDENT_MODES:
        raise SchemaError(f"incident record field 'mode' = {obj['mode']!r}; expected one of {INCIDENT_MODES}")
    return obj
