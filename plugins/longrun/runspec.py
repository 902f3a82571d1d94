"""RunSpec: the typed form of `training_run`'s Params, and the job environment it hands the entrypoint.

The DAG's Params form refuses most bad input already; this is the second line, for runs started from
code, the CLI or a relaunch, and the one place that turns a run into the job's LONGRUN_* settings
(`job_env`; the names: longrun.entrypoint). The entrypoint, its arguments and the job's interpreter are
checked by longrun.entrypoint against the site's settings (LONGRUN_ENTRYPOINT_DIR, LONGRUN_JOB_PYTHONS).
Pure Python: no Airflow, no torch.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longrun import entrypoint as ep
from training.config import (
    ENV_CHECKPOINT_EVERY,
    ENV_MODEL,
    ENV_PARALLELISM,
    ENV_RECOMPUTE_EVERY,
    ENV_RUN_DIR,
    ENV_RUN_NAME,
    ENV_SEED,
    ENV_STEPS,
    ENV_VOTE_EVERY,
    PARALLELISMS,
)
from training.records.schema import FAULT_KINDS, INCIDENT_MODES, MODEL_PRESETS, NODE_NAME, check_run_name

_CKPT_REF = re.compile(r"^[A-Za-z0-9._/-]{1,512}$")


class RunSpecError(ValueError):
    """A run parameter is invalid. The message names the field and the bad value."""

    def __init__(self, field_name: str, value: Any, why: str) -> None:
        super().__init__(f"{field_name}={value!r}: {why}")
        self.field = field_name


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RunSpecError(name, value, "must be an integer")
    if not lo <= value <= hi:
        raise RunSpecError(name, value, f"must be between {lo} and {hi}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class Drill:
    """A fault to inject on purpose, to rehearse an incident."""

    kind: str
    """One of training.records.schema.FAULT_KINDS."""
    step: int
    """The step at which the fault starts."""
    target: str
    """A global rank number ("1"), or a node name ("n2"): the job is pinned to that node, and the fault
    fires on it (every rank for `sick-node`, the node's lowest rank for the other kinds)."""

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise RunSpecError("drill.kind", self.kind, f"must be one of {', '.join(FAULT_KINDS)}")
        _int("drill.step", self.step, 1, 10_000_000)
        target = str(self.target)
        object.__setattr__(self, "target", target)
        if self.kind == "sick-node" and not NODE_NAME.match(target):
            raise RunSpecError("drill.target", target, "must be a node name for a sick-node drill")
        if not target.isdigit() and not NODE_NAME.match(target):
            raise RunSpecError("drill.target", target, "must be a rank number or a node name")

    @property
    def node(self) -> str | None:
        """The node the drill names, or None when it names a rank."""
        return None if self.target.isdigit() else self.target

    def flag(self) -> str:
        """The trainer's `--fault KIND:STEP:TARGET` value."""
        return f"{self.kind}:{self.step}:{self.target}"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    """One training run as longrun launches it."""

    run_name: str
    """Run name: the store prefix, the Slurm job name and the run dir's name."""
    nodes: int = 3
    """Number of nodes."""
    gpus_per_node: int = 8
    """GPUs per node (one rank per GPU); 0 means CPU ranks."""
    ranks_per_node: int = 0
    """Ranks started on each node; 0: one per GPU (`gpus_per_node`), or one per node for CPU ranks. With GPUs
    it is 0 or `gpus_per_node` (one rank per GPU); CPU ranks may be several per node."""
    parallelism: str = "ddp"
    """How the model is spread over the ranks (training.config.PARALLELISMS): `ddp` whole replicas; `fsdp`
    FSDP2 over every rank (the finite check and the forward recompute; no vote: no shard has a second
    holder); `hsdp` FSDP2 within a node and replicas across nodes (finite check, forward recompute, a weight
    vote per shard). Sharded runs have no hot spares yet (`spare_nodes` must be 0)."""
    partition: str = "debug"
    """Slurm partition."""
    model: str = "tiny"
    """Model preset of the reference trainer (checked, and handed to the job, only for that entrypoint)."""
    entrypoint: str = ep.REFERENCE
    """What the job runs: `module:<dotted.name>` or `script:<path>` (inside the site's
    LONGRUN_ENTRYPOINT_DIR); default the reference trainer (longrun.entrypoint)."""
    entrypoint_args: tuple[str, ...] = ()
    """The entrypoint's arguments, one argv entry each (never a shell string)."""
    job_python: str = ""
    """The interpreter of the job's Python environment (one of the site's LONGRUN_JOB_PYTHONS); its
    `ft_launcher` is used. Empty: the Airflow worker's own interpreter."""
    steps: int = 40
    """Optimizer steps to run in total (a resumed run continues to this step)."""
    checkpoint_every: int = 10
    """Save a checkpoint every N steps (always after a weight vote)."""
    recompute_every: int = 5
    """Cross-node recompute audit every N steps (0: off)."""
    vote_every: int = 5
    """Weight vote every N steps (0: only before checkpoints)."""
    incident_mode: str = "act"
    """What the incident DAG does on an alert: act, approve (human in the loop) or observe."""
    drill: Drill | None = None
    """A fault to inject (first launch only; a relaunch never re-injects it)."""
    seed: int = 1234
    """Seed of the model init and the synthetic data."""
    exclude: tuple[str, ...] = ()
    """Nodes the job must not use (nodes drained by an incident)."""
    resume_from: str | None = None
    """Checkpoint to resume from: a store key prefix (runs/<run>/checkpoints/step-N/) or a local dir."""
    attempt: int = 0
    """0 for the first launch; +1 for each relaunch after an incident."""
    spare_nodes: int = 0
    """Hot spares the job holds beyond `nodes` (0: none). After an SDC verdict the next attempt runs inside
    the same job on the healthy nodes plus a spare, from sdc_incident's directive (longrun.hotspare)."""
    max_restarts: int = 3
    """In-job restarts NVRx's ft_launcher may do for crashes and hangs (not for SDC verdicts)."""
    time_limit_min: int = 60
    """Slurm wall-clock limit of one launch."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the job (validated by the Slurm layer)."""

    def __post_init__(self) -> None:
        try:
            check_run_name(self.run_name)
        except ValueError as e:
            raise RunSpecError("run_name", self.run_name, str(e)) from None
        _int("nodes", self.nodes, 1, 4096)
        _int("gpus_per_node", self.gpus_per_node, 0, 64)
        _int("ranks_per_node", self.ranks_per_node, 0, 64)
        if self.gpus_per_node and self.ranks_per_node not in (0, self.gpus_per_node):
            raise RunSpecError(
                "ranks_per_node", self.ranks_per_node,
                f"must be 0 or gpus_per_node ({self.gpus_per_node}): one rank per GPU",
            )  # fmt: skip
        self._check_parallelism()
        if not NODE_NAME.match(str(self.partition)):
            raise RunSpecError("partition", self.partition, "must be a plain Slurm partition name")
        try:
            _entry, args, _python = ep.check(self.entrypoint, self.entrypoint_args, self.job_python)
        except ep.EntrypointError as e:
            raise RunSpecError(e.field, e.value, e.why) from None
        object.__setattr__(self, "entrypoint_args", args)
        # The presets are the reference trainer's; any other entrypoint ignores `model`.
        if self.is_reference and self.model not in MODEL_PRESETS:
            raise RunSpecError("model", self.model, f"must be one of {', '.join(MODEL_PRESETS)}")
        _int("steps", self.steps, 1, 10_000_000)
        _int("checkpoint_every", self.checkpoint_every, 1, self.steps)
        _int("recompute_every", self.recompute_every, 0, 10_000_000)
        _int("vote_every", self.vote_every, 0, 10_000_000)
        if self.incident_mode not in INCIDENT_MODES:
            raise RunSpecError(
                "incident_mode", self.incident_mode, f"must be one of {', '.join(INCIDENT_MODES)}"
            )
        _int("seed", self.seed, 0, 2**31 - 1)
        _int("attempt", self.attempt, 0, 1000)
        _int("max_restarts", self.max_restarts, 0, 100)
        _int("spare_nodes", self.spare_nodes, 0, 64)
        _int("time_limit_min", self.time_limit_min, 1, 30 * 24 * 60)
        if self.drill is not None:
            if self.drill.step > self.steps:
                raise RunSpecError("drill.step", self.drill.step, f"is after the last step ({self.steps})")
            if self.drill.node is None and int(self.drill.target) >= self.world_size:
                raise RunSpecError(
                    "drill.target", self.drill.target, f"no such rank in a world of {self.world_size}"
                )
        exclude = tuple(self.exclude)
        for node in exclude:
            if not NODE_NAME.match(str(node)):
                raise RunSpecError("exclude", node, "must be a node name")
        object.__setattr__(self, "exclude", exclude)
        if reserved := sorted(set(self.extra_env) & set(ep.JOB_ENV)):
            raise RunSpecError(
                "extra_env", reserved, "the job environment's LONGRUN_* settings come from the run"
            )
        if self.resume_from is not None and (
            not _CKPT_REF.match(self.resume_from) or ".." in self.resume_from
        ):
            raise RunSpecError(
                "resume_from", self.resume_from, "must be a checkpoint key prefix or directory"
            )

    def _check_parallelism(self) -> None:
        """What a sharded run needs and what it does not have yet, refused by name before anything runs."""
        if self.parallelism not in PARALLELISMS:
            raise RunSpecError("parallelism", self.parallelism, f"must be one of {', '.join(PARALLELISMS)}")
        if self.parallelism == "ddp":
            return
        if self.parallelism == "hsdp" and self.nodes < 2:
            raise RunSpecError("nodes", self.nodes, "hsdp replicates across nodes: 2 nodes or more (or fsdp)")
        if self.spare_nodes:
            raise RunSpecError(
                "spare_nodes", self.spare_nodes,
                f"must be 0 with parallelism {self.parallelism}: hot spares are not built for sharded runs yet",
            )  # fmt: skip

    def checks_run(self) -> tuple[str, ...]:
        """The checks a launch of this run runs, as the pick after an alert must know them (a check that
        does not run bounds nothing): the finite check always; the recompute with a cadence (under FSDP2
        and HSDP too, every rank at once: docs/sharding.md); the weight vote except under FSDP2 (nothing
        replicated to vote with)."""
        out = ["finite"]
        if self.recompute_every:
            out.append("recompute")
        if self.parallelism != "fsdp":
            out.append("weight_vote")
        return tuple(out)

    @property
    def is_reference(self) -> bool:
        """Whether the entrypoint is the reference trainer (training.train)."""
        return ep.is_reference(self.entrypoint)

    @property
    def node_ranks(self) -> int:
        """Ranks per node as launched (`ranks_per_node`, or its default)."""
        return self.ranks_per_node or max(1, self.gpus_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.node_ranks

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RunSpec:
        """Build from a Params dict (unknown keys are an error: a typo must not be silently ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise RunSpecError(
                unknown[0], params[unknown[0]], f"is not a run parameter; known: {sorted(known)}"
            )
        values = dict(params)
        drill = values.get("drill")
        if isinstance(drill, Mapping):
            missing = {"kind", "step", "target"} - set(drill)
            if missing:
                raise RunSpecError("drill", drill, f"lacks {sorted(missing)}")
            values["drill"] = Drill(kind=drill["kind"], step=drill["step"], target=str(drill["target"]))
        elif drill is not None:
            raise RunSpecError("drill", drill, "must be null or an object with kind, step, target")
        if "exclude" in values:
            values["exclude"] = tuple(values["exclude"] or ())
        if values.get("job_python") is None and "job_python" in values:
            values["job_python"] = ""  # a form's null: the default interpreter
        if values.get("entrypoint_args") is None and "entrypoint_args" in values:
            values["entrypoint_args"] = ()  # a form's null: no arguments
        return cls(**values)

    def to_params(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["exclude"] = list(self.exclude)
        out["entrypoint_args"] = list(self.entrypoint_args)
        out["extra_env"] = dict(self.extra_env)
        return out

    def relaunch(self, *, resume_from: str | None, exclude: tuple[str, ...]) -> RunSpec:
        """The spec of the launch after an incident: no drill, the bad nodes excluded, resumed from
        `resume_from` (None: nothing provably clean, so the next attempt starts over)."""
        return dataclasses.replace(
            self,
            drill=None,
            resume_from=resume_from,
            exclude=tuple(dict.fromkeys((*self.exclude, *exclude))),
            attempt=self.attempt + 1,
        )

    def job_env(self, *, run_dir: str) -> dict[str, str]:
        """The settings every launch of this run exports to its entrypoint (docs/contracts.md, "The job's
        environment"): run, run dir, cadences and seed, plus the model preset for the reference trainer.
        The drill (LONGRUN_FAULTS), the resume point and a standby's directive wait depend on the launch
        or attempt and are set by the batch script (longrun.launch, longrun.hotspare)."""
        env = {
            ENV_RUN_NAME: self.run_name,
            ENV_RUN_DIR: run_dir,
            ENV_STEPS: str(self.steps),
            ENV_CHECKPOINT_EVERY: str(self.checkpoint_every),
            ENV_RECOMPUTE_EVERY: str(self.recompute_every),
            ENV_VOTE_EVERY: str(self.vote_every),
            ENV_SEED: str(self.seed),
            ENV_PARALLELISM: self.parallelism,
        }
        if self.is_reference:
            env[ENV_MODEL] = self.model
        return env
