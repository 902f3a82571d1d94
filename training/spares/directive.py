"""The relaunch directive: the orchestrator tells a job that kept its allocation where to train next.

Written by `sdc_incident` (act mode, after attribution, the drain and the pick) on the orchestrator's
side of the store, under the run's `directives/`; read by the job's supervisor (training.spares.supervisor).
Its authenticity rests on the store: the job's identity may read `directives/` but not write it
(training.store.sides), so neither the job nor another job can forge one. The per-job alert key is not
used here: the job holds that key, so a signature made with it would prove nothing against the job.
The supervisor still checks every field against what it knows (its run, its job id, the attempt it
waits for, nodes inside its allocation, not the suspect's node), and refuses anything else.

    directives/<job id>-a<attempt>.json      one per relaunch inside a job (written once)

Each attempt's training step carries its attempt in its Slurm step name (`ATTEMPT_STEP_PREFIX` and the
attempt, what `squeue -s` shows), so the orchestrator can tell an earlier attempt still ending from the
next one's standby: a directive is written only once no earlier attempt's step is left
(longrun.incident.hot_spare).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from training.records.base import FIELDS_HERE, Declared
from training.records.fields import Field, at_least, opt_float, opt_int, opt_str, opt_strs
from training.records.schema import NODE_NAME, SchemaError, store_key
from training.store.interface import NotFound, ObjectStore

DIRECTIVE_SCHEMA_VERSION = 1
DIRECTIVES_DIR = "directives/"

_REF = re.compile(r"^[A-Za-z0-9._/-]{1,512}$")

#: Slurm step name of attempt N of a job that keeps its allocation: ATTEMPT_STEP_PREFIX + str(N).
ATTEMPT_STEP_PREFIX = "longrun-attempt-"


def attempt_of_step_name(name: str) -> int | None:
    """The attempt a training step's name carries; None for any other step (a diagnostic, a foreign one)."""
    rest = name.removeprefix(ATTEMPT_STEP_PREFIX)
    return int(rest) if rest != name and rest.isdigit() and len(rest) < 6 else None


def directive_path(job_id: str, attempt: int) -> str:
    return f"{DIRECTIVES_DIR}{job_id}-a{attempt:03d}.json"


def directed_nodes(held: Sequence[str], excluded: Iterable[str]) -> list[str]:
    """The nodes a directive may name, in the order it names them: the job's nodes in allocation order
    without the excluded ones (sdc_incident writes the first `width`; the standby predicts the same)."""
    out = set(excluded)
    return [n for n in held if n not in out]


def read_directive(store: ObjectStore, *, run: str, job_id: str, attempt: int) -> Directive | None:
    """The directive for (`run`, `job_id`, `attempt`); None while there is none. StoreError when it cannot
    be read, ValueError when it is malformed: both mean it must not be followed."""
    try:
        raw = store.get_bytes(store_key(run, directive_path(job_id, attempt)))
    except NotFound:
        return None
    return Directive.from_json(raw)


def _slurm_job_id(v: Any) -> str | None:
    return None if isinstance(v, str) and v.isdigit() else "must be a Slurm job id"


def _checkpoint_ref(v: Any) -> str | None:
    good = isinstance(v, str) and _REF.match(v) and ".." not in v.split("/")
    return None if good else "is not a checkpoint reference"


@dataclass(frozen=True, kw_only=True, slots=True)
class Directive(Declared):
    """Run the next training step of job `job_id` on `nodes`, from `resume_from`."""

    KIND = "directive"
    VERSION = DIRECTIVE_SCHEMA_VERSION
    FIELDS = {
        "run": Field(opt_str),
        "job_id": Field(opt_str, checks=(_slurm_job_id,)),
        "attempt": Field(opt_int, checks=(at_least(1),)),
        "nodes": Field(opt_strs),
        "resume_from": Field(opt_str, checks=(_checkpoint_ref,)),
        "incident_id": Field(opt_str),
        "exclude": Field(opt_strs),
        "issued_at": Field(opt_float),
    }
    ORDER = (FIELDS_HERE, "schema_version", "kind")

    run: str
    """Run name."""
    job_id: str
    """The Slurm job that must run it (a directive for another job is refused)."""
    attempt: int
    """The in-job attempt it starts (1 for the first relaunch inside the job)."""
    nodes: tuple[str, ...]
    """Nodes of the next step: the healthy nodes kept plus spares, never the suspect."""
    resume_from: str
    """The pre-incident checkpoint (a store prefix)."""
    incident_id: str
    """The incident that issued it."""
    exclude: tuple[str, ...]
    """Nodes the step must not use (the suspect's node): checked again by the supervisor."""
    issued_at: float
    """Wall time of the decision (the time-to-recover record reads it)."""
    schema_version: int = DIRECTIVE_SCHEMA_VERSION

    def _settle(self) -> None:
        """The nodes: distinct, named as Slurm names nodes, none of them excluded (kept as tuples)."""
        nodes, exclude = tuple(self.nodes), tuple(self.exclude)
        if not nodes or len(set(nodes)) != len(nodes):
            raise SchemaError(f"{self.KIND} record field 'nodes' = {list(nodes)!r} must name distinct nodes")
        for n in (*nodes, *exclude):
            if not isinstance(n, str) or not NODE_NAME.match(n):
                raise SchemaError(f"{self.KIND} record field 'nodes' has a bad node name {n!r}")
        if clash := sorted(set(nodes) & set(exclude)):
            raise SchemaError(f"{self.KIND} record field 'nodes' includes excluded node(s) {clash}")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "exclude", exclude)

    @property
    def relative_path(self) -> str:
        return directive_path(self.job_id, self.attempt)

    def refusal(
        self, *, run: str, job_id: str, attempt: int, allocation: Iterable[str], width: int
    ) -> str | None:
        """Why the supervisor of (`run`, `job_id`), waiting for `attempt`, must not follow this directive
        on its current `allocation` with `width` nodes per step; None when it may."""
        if self.run != run:
            return f"directive is for run {self.run!r}, not {run!r}"
        if self.job_id != job_id:
            return f"directive is for job {self.job_id}, not {job_id}"
        if self.attempt != attempt:
            return f"directive starts attempt {self.attempt}, expected {attempt}"
        outside = sorted(set(self.nodes) - set(allocation))
        if outside:
            return f"directive names node(s) {outside} outside the job's allocation {sorted(allocation)}"
        if len(self.nodes) != width:
            return f"directive names {len(self.nodes)} node(s); a step needs {width}"
        return None
