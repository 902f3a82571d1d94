"""Drills are an operator's act: who may set one (a setting), and the orchestrator's record that one did.

A drill makes longrun's own probes convict a node: a `sick-node` drill leaves a marker in the run's
fault-state dir, the replay probe on that node reads the dir, fails, and the node is drained as sick and
marked for replacement. The job writes that dir. So only the people the cluster's operators name may set a
drill, and a probe reads a run's fault state only while this record says an operator set the run's drill
(longrun.incident.drill_state).

Who may: the Airflow Variable `longrun_drill_operators`, a JSON object `{"users": [Airflow user names],
"roles": [Airflow role names]}`. A run with `drill` set is allowed only when Airflow recorded who triggered
it and that user is listed or holds a listed role (roles compare without regard to case: Airflow's simple
auth manager writes them in either). Without the Variable nobody may (`permit`). Nothing here is read from
the DAG-run conf, which whoever triggers the run writes.

The grant (`runs/<run>/drill-grant.json`, on the orchestrator's side of the store: a job can neither write
nor delete it) is written by `training_run`'s preflight once the check passed and the run name is claimed,
before anything reaches Slurm: the drill, who set it and as what, the DAG run that launches it, and the
fault-state dir the run's jobs use. It ends when the drill's incident closes (`end`); an ended grant lets
no probe read the run's fault state again.

No Airflow here: the task reads the Variable, the triggering user and the user's roles, and hands them in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from longrun.alert_auth import bound_tag
from longrun.slurm.spec import JobTag
from training.records import schema
from training.records.base import Declared
from training.records.fields import (
    Field,
    at_least,
    non_empty,
    one_of,
    opt_float,
    opt_int,
    opt_str,
    run_name,
)
from training.records.schema import FAULT_KINDS, NODE_NAME
from training.store.interface import NotFound, ObjectStore, dump_json
from training.store.update import update_json

KIND = "drill_grant"
GRANT_PATH = "drill-grant.json"
SCHEMA_VERSION = 1
OPERATORS_VARIABLE = "longrun_drill_operators"
#: The DAG whose preflight grants a drill and whose `submit` launches it.
LAUNCH_DAG = "training_run"


@dataclass(frozen=True, slots=True)
class DrillOperators:
    """Who may set a drill: Airflow user names, and Airflow roles (kept case-folded)."""

    users: frozenset[str] = frozenset()
    roles: frozenset[str] = frozenset()

    @classmethod
    def from_setting(cls, raw: Any) -> DrillOperators:
        """The Variable's value (None or empty: nobody). ValueError naming the Variable when it is not
        `{"users": [...], "roles": [...]}` with non-empty strings."""
        if raw is None or raw == "":
            return cls()
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError as e:
                raise ValueError(f"Variable {OPERATORS_VARIABLE} is not JSON: {e}") from None
        shape = f'expected a JSON object {{"users": [user names], "roles": [role names]}}, got {raw!r:.200}'
        if not isinstance(raw, Mapping) or set(raw) - {"users", "roles"}:
            raise ValueError(f"Variable {OPERATORS_VARIABLE}: {shape}")
        lists = {}
        for field in ("users", "roles"):
            values = raw.get(field) or []
            if not isinstance(values, list) or not all(isinstance(v, str) and v.strip() for v in values):
                raise ValueError(f"Variable {OPERATORS_VARIABLE} field {field!r}: {shape}")
            lists[field] = [v.strip() for v in values]
        return cls(users=frozenset(lists["users"]), roles=frozenset(r.casefold() for r in lists["roles"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class DrillPermit:
    """Whether the run's triggering user may set its drill, and why (for the log and the grant)."""

    allowed: bool
    why: str
    """One line for people; a refusal names the Variable."""
    user: str | None = None
    """The triggering user, as Airflow recorded it."""
    allowed_as: str | None = None
    """`user <name>` or `role <name>`: the entry of the Variable that allowed it."""


def permit(*, user: str | None, roles: Collection[str] | None, operators: DrillOperators) -> DrillPermit:
    """May `user` (Airflow's record of who triggered the run) set a drill? `roles`: the user's Airflow
    roles, or None when the auth manager cannot tell a task (then only `users` counts). Fails closed: an
    unknown user, or a Variable that lists nobody, allows nothing."""
    setting = f"Airflow Variable {OPERATORS_VARIABLE}"
    if not isinstance(user, str) or not user.strip():
        return DrillPermit(
            allowed=False,
            why=(
                "Airflow did not record who triggered this run, so nobody can tell that an operator set its"
                f" drill; only the users and roles in {setting} may set one"
            ),
        )
    if user in operators.users:
        return DrillPermit(
            allowed=True, why=f"{user} is a drill operator", user=user, allowed_as=f"user {user}"
        )
    held = sorted({r.casefold() for r in roles or ()} & operators.roles)
    if held:
        return DrillPermit(
            allowed=True,
            why=f"{user} holds role {held[0]}, a drill operator role",
            user=user,
            allowed_as=f"role {held[0]}",
        )
    if not operators.users and not operators.roles:
        listed = f"{setting} is not set or lists nobody"
    else:
        listed = f"{setting} lists users {sorted(operators.users)} and roles {sorted(operators.roles)}"
    if roles is None:
        own = "Airflow's auth manager does not tell a task its users' roles, so list the user by name"
    else:
        own = f"{user}'s roles: {sorted(roles)}"
    return DrillPermit(
        allowed=False,
        why=(
            f"{user} may not set a drill (a drill makes longrun's own probes convict a node, so it is an"
            f" operator's act): {listed}; {own}"
        ),
        user=user,
    )


def _rank_or_node(v: Any) -> str | None:
    good = isinstance(v, str) and (v.isdigit() or NODE_NAME.match(v) is not None)
    return None if good else "not a rank or a node name"


def _absolute(v: Any) -> str | None:
    return None if isinstance(v, str) and v.startswith("/") else "must be an absolute path"


@dataclass(frozen=True, slots=True, kw_only=True)
class DrillGrant(Declared):
    """The `drill_grant` record: an operator set this run's drill."""

    KIND = KIND
    FIELDS = {
        "run": Field(opt_str, checks=(run_name,)),
        "dag_run_id": Field(opt_str, checks=(non_empty,)),
        "kind": Field(opt_str, key="drill_kind", checks=(one_of(FAULT_KINDS),)),
        "step": Field(opt_int, checks=(at_least(1),)),
        "target": Field(opt_str, checks=(_rank_or_node,)),
        "set_by": Field(opt_str, checks=(non_empty,)),
        "allowed_as": Field(opt_str, checks=(non_empty,)),
        "fault_state_dir": Field(opt_str, checks=(_absolute,)),
        "granted_at": Field(opt_float),
        "ended_at": Field(opt_float, need=False, when="ended_at"),
        "ended_by": Field(opt_str, need=False, when="ended_at"),
    }

    run: str
    """The run name."""
    dag_run_id: str
    """The training_run DAG run that launches the drill (its `submit` job carries its tag)."""
    kind: str
    """The drill's kind (training.records.schema.FAULT_KINDS), written as `drill_kind`."""
    step: int
    """The step it fires at."""
    target: str
    """A rank number or a node name, as the drill's Param gave it."""
    set_by: str
    """The Airflow user who triggered the run."""
    allowed_as: str
    """`user <name>` or `role <name>`: what allowed it."""
    fault_state_dir: str
    """Where the run's jobs keep drill state (sick-node markers), as the preflight's worker saw it."""
    granted_at: float
    """Epoch seconds."""
    ended_at: float | None = None
    """When the drill's incident closed (None: the drill is on)."""
    ended_by: str | None = None
    """The incident whose closing ended it (written with `ended_at`)."""
    schema_version: int = SCHEMA_VERSION

    @property
    def active(self) -> bool:
        """The drill's incident has not closed."""
        return self.ended_at is None

    @property
    def node(self) -> str | None:
        """The node the drill names, or None when it names a rank."""
        return None if self.target.isdigit() else self.target


def grant_key(run: str) -> str:
    return schema.store_key(run, GRANT_PATH)


def grant(
    *, run: str, dag_run_id: str, drill: Mapping[str, Any], by: DrillPermit, fault_state_dir: str
) -> DrillGrant:
    """The grant of an allowed drill (`drill`: the run's `{kind, step, target}`)."""
    if not by.allowed or by.user is None or by.allowed_as is None:
        raise ValueError(f"no grant for a drill that was not allowed: {by.why}")
    return DrillGrant(
        run=run,
        dag_run_id=dag_run_id,
        kind=str(drill["kind"]),
        step=int(drill["step"]),
        target=str(drill["target"]),
        set_by=by.user,
        allowed_as=by.allowed_as,
        fault_state_dir=fault_state_dir,
        granted_at=time.time(),
    )


def write(store: ObjectStore, rec: DrillGrant) -> None:
    """Store the grant (a retried preflight of the same DAG run writes it again)."""
    store.put_bytes(grant_key(rec.run), dump_json(rec.to_json()))


def read(store: ObjectStore, run: str) -> DrillGrant | None:
    """The run's grant; None when there is none, the run name is not one, or the record does not read
    (no grant is no drill: a probe then reads no run state)."""
    try:
        return DrillGrant.from_json(store.get_bytes(grant_key(run)))
    except (NotFound, ValueError):  # a SchemaError is a ValueError
        return None


def end(store: ObjectStore, run: str, *, incident_id: str) -> DrillGrant | None:
    """End the run's grant because `incident_id` closed (once: a grant ended before stays as it was).
    The grant as stored afterwards; None when the run has none."""
    if read(store, run) is None:
        return None

    def change(raw: Any) -> Any:
        rec = DrillGrant.from_json(raw)
        if not rec.active:
            return None  # ended before: nothing to write
        return replace(rec, ended_at=time.time(), ended_by=incident_id).to_json()

    update_json(store, grant_key(run), change, dump=dump_json, what="drill grant")
    return read(store, run)


def launched_by(store: ObjectStore, rec: DrillGrant, job_id: int | None) -> bool:
    """Is Slurm job `job_id` the drill's launch: submitted by the granted training_run DAG run, by the
    orchestrator's own record of the job (the alert key bound to the job id at submit), never by what
    Slurm or the job says about itself."""
    if job_id is None:
        return False
    tag = JobTag.parse(bound_tag(store, run=rec.run, job_id=job_id) or "")
    return tag is not None and tag.dag_id == LAUNCH_DAG and tag.run_id == rec.dag_run_id
