"""One run, one name: the first `training_run` with a run name claims it; another is refused.

A run name is a run's identity: the store prefix `runs/<run>/`, its checkpoints, promotions and incidents.
Two runs under one name would mix their checkpoints (a relaunch could resume from the other run's) and
their incidents. So preflight claims the name with a conditional write (`runs/<run>/claim.json`, on the
orchestrator's side of the store, created only if absent: of two runs racing, exactly one wins).

Allowed with a claim in place: the same DAG run again (a retried or cleared preflight), and a relaunch
attempt from `sdc_incident` (`continues`: the caller has checked the DAG run against the orchestrator's
own record of that relaunch, longrun.monitor.launches; the conf alone never decides it). Records of the
name without any claim (a run from before claims existed) also count as in use.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from training.records import schema
from training.records.base import Declared
from training.records.fields import Field, epoch_seconds, non_empty, opt_float, opt_str, run_name
from training.store.interface import NotFound, ObjectStore, dump_json
from training.store.update import UpdateConflict, create_or_read

KIND = "run_claim"
CLAIM_PATH = "claim.json"
SCHEMA_VERSION = 1


class RunNameInUse(RuntimeError):
    """The run name belongs to another run; the message says which and what to do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunClaim(Declared):
    """Who owns a run name."""

    KIND = KIND
    FIELDS = {
        "run": Field(opt_str, checks=(run_name,)),
        "dag_run_id": Field(opt_str, checks=(non_empty,)),
        "claimed_at": Field(opt_float, checks=(epoch_seconds,)),
    }

    run: str
    """The run name."""
    dag_run_id: str
    """The training_run DAG run that claimed it."""
    claimed_at: float
    """Epoch seconds of the claim."""
    schema_version: int = SCHEMA_VERSION


def claim_key(run: str) -> str:
    return schema.store_key(run, CLAIM_PATH)


def read_claim(store: ObjectStore, run: str) -> RunClaim | None:
    try:
        return RunClaim.from_json(json.loads(store.get_bytes(claim_key(run))))
    except NotFound:
        return None


def _other_records(store: ObjectStore, run: str) -> list[str]:
    keys = []
    for info in store.list(schema.run_prefix(run)):
        if info.key != claim_key(run):
            keys.append(info.key)
            if len(keys) >= 3:
                break
    return keys


def claim(store: ObjectStore, run: str, dag_run_id: str, *, continues: bool) -> RunClaim:
    """Claim `run` for `dag_run_id`, or confirm it is ours (or continued); raise RunNameInUse otherwise.

    The claim is created only if absent; of two racing, the loser reads the winner's claim and is judged
    by it (training.store.update.create_or_read)."""
    held = read_claim(store, run)
    if held is None:
        if not continues and (found := _other_records(store, run)):
            raise RunNameInUse(
                f"run name {run!r} is in use: the store already holds its records ({', '.join(found)}),"
                " written by a run without a claim. Pick another run_name"
            )
        mine = RunClaim(run=run, dag_run_id=dag_run_id, claimed_at=time.time())
        try:
            first = create_or_read(store, claim_key(run), dump_json(mine.to_json()))
        except UpdateConflict:
            raise RunNameInUse(
                f"run name {run!r}: the claim changed twice while reading it; try again"
            ) from None
        if first.created:
            return mine
        held = RunClaim.from_json(json.loads(first.data))
    if held.dag_run_id == dag_run_id or continues:
        return held
    raise RunNameInUse(
        f"run name {run!r} is in use: training_run run {held.dag_run_id!r} claimed it at"
        f" {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(held.claimed_at))}. Pick another"
        " run_name; only sdc_incident's relaunch of that run may continue it"
    )
