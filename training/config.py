"""Configuration of the reference trainer and its checks: keyword-only, slotted dataclasses.

Each field has a docstring; `__post_init__` rejects bad values with a message that names the field and the
value, so a typo in a DAG's Params fails at launch, not at step 9000.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.records.schema import CHECKS, check_run_name

VERDICT_ACTIONS = ("exit", "record")


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _non_negative(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """A small decoder-only transformer language model."""

    vocab_size: int
    """Tokens in the vocabulary."""
    d_model: int
    """Width of the residual stream."""
    n_layers: int
    """Transformer blocks."""
    n_heads: int
    """Attention heads per block; must divide d_model."""
    seq_len: int
    """Tokens per sequence."""
    batch_size: int
    """Sequences in one rank's micro-batch (never split into accumulation steps: that changes the bits)."""
    mlp_ratio: int = 4
    """Hidden width of the MLP as a multiple of d_model."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "seq_len", "batch_size", "mlp_ratio"):
            _positive(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model}")


#: Presets by name. `tiny`: a 40-step, 4-rank CPU run in about a minute including process start.
#: `small`: the benchmark's reference model (~3.4 M parameters).
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, seq_len=32, batch_size=8),
    "small": ModelConfig(vocab_size=1024, d_model=256, n_layers=4, n_heads=8, seq_len=64, batch_size=8),
}


def model_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"model preset {name!r} is unknown; known: {sorted(PRESETS)}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckConfig:
    """Which SDC checks run, how often, and what a verdict does."""

    checks: tuple[str, ...] = CHECKS
    """Enabled checks, any of 'finite', 'recompute', 'weight_vote'."""
    recompute_every: int = 10
    """Audit cadence of the cross-node recompute, in steps (0: never). Costs ~1/recompute_every of a step."""
    vote_every: int = 10
    """Cadence of the weight vote, in steps (0: only right before a checkpoint save)."""
    recompute_loss_rtol: float = 0.0
    """Relative tolerance on the recomputed loss. 0 (default) compares loss bits and the gradient
    fingerprint exactly; > 0 compares only the loss within this tolerance, for kernels that are not
    bitwise deterministic (the gradient fingerprint is then meaningless)."""
    on_verdict: str = "exit"
    """'exit': write the alert, then every rank exits with EXIT_SDC_VERDICT. 'record': write the alert,
    skip the update where the check ran before it, and keep training (drills, false-positive studies)."""

    def __post_init__(self) -> None:
        unknown = [c for c in self.checks if c not in CHECKS]
        if unknown or len(set(self.checks)) != len(self.checks):
            raise ValueError(f"checks={self.checks!r}: each must be one of {CHECKS}, no repeats")
        _non_negative("recompute_every", self.recompute_every)
        _non_negative("vote_every", self.vote_every)
        if not 0.0 <= self.recompute_loss_rtol < 1.0:
            raise ValueError(f"recompute_loss_rtol must be in [0, 1), got {self.recompute_loss_rtol!r}")
        if self.on_verdict not in VERDICT_ACTIONS:
            raise ValueError(f"on_verdict must be one of {VERDICT_ACTIONS}, got {self.on_verdict!r}")

    def enabled(self, check: str) -> bool:
        return check in self.checks


#: The environment variables through which longrun's launch hands its settings to any entrypoint
#: (docs/contracts.md, "The job's environment"). `GuardConfig.from_env` reads them; the reference trainer's flags
#: default to them.
ENV_RUN_NAME = "LONGRUN_RUN_NAME"
ENV_RUN_DIR = "LONGRUN_RUN_DIR"
ENV_STEPS = "LONGRUN_STEPS"
ENV_CHECKPOINT_EVERY = "LONGRUN_CHECKPOINT_EVERY"
ENV_RECOMPUTE_EVERY = "LONGRUN_RECOMPUTE_EVERY"
ENV_VOTE_EVERY = "LONGRUN_VOTE_EVERY"
ENV_SEED = "LONGRUN_SEED"
ENV_RESUME_FROM = "LONGRUN_RESUME_FROM"
ENV_AWAIT_DIRECTIVE_S = "LONGRUN_AWAIT_DIRECTIVE_S"
ENV_FAULTS = "LONGRUN_FAULTS"
ENV_MODEL = "LONGRUN_MODEL"
ENV_PARALLELISM = "LONGRUN_PARALLELISM"

#: How the model is spread over the ranks (`ENV_PARALLELISM`): `ddp`, a whole replica on every rank;
#: `fsdp`, FSDP2 sharding over every rank (nothing replicated); `hsdp`, FSDP2 sharding within each node and
#: replication across nodes (training.api.sharding, docs/sharding.md).
PARALLELISMS = ("ddp", "fsdp", "hsdp")


def checks_for_parallelism(parallelism: str, checks: tuple[str, ...]) -> tuple[str, ...]:
    """`checks` less what `parallelism` cannot run: the weight vote under `fsdp`, where no shard has a second
    holder to vote with (training.api.sharding refuses a configured vote there). Launch-side defaults go
    through this, so a default check list does not fail a sharded set-up; a vote a user asks for directly in
    `prepare_sharded` is still refused."""
    if parallelism == "fsdp":
        return tuple(c for c in checks if c != "weight_vote")
    return checks


def parallelism_from_env(env: Mapping[str, str] | None = None) -> str:
    """`LONGRUN_PARALLELISM` (default `ddp`); ValueError naming the variable for any other value."""
    raw = (os.environ if env is None else env).get(ENV_PARALLELISM, "").strip() or "ddp"
    if raw not in PARALLELISMS:
        raise ValueError(
            f"environment variable {ENV_PARALLELISM}={raw!r} is not one of {', '.join(PARALLELISMS)}"
        )
    return raw


def env_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    """An integer setting from the environment; a value that is not one is an error naming the variable."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardConfig:
    """One guarded run (training.api.Guard): what longrun needs to know of any training loop."""

    run: str
    """Run name (store prefix runs/<run>/)."""
    run_dir: Path
    """Local directory for records; shared by the ranks in tests, node-local on a cluster."""
    steps: int
    """Train until this step (inclusive of the last, counted from 1)."""
    checks: CheckConfig = field(default_factory=CheckConfig)
    """SDC checks."""
    checkpoint_every: int = 0
    """Checkpoint cadence in steps (0: none)."""
    async_save: bool = True
    """A sharded model's checkpoints (`Guard.prepare_sharded`) are written in the background
    (`torch.distributed.checkpoint.async_save`): the step waits only for the copy of its state to host
    memory. False: the step waits until every rank's files are written. DDP checkpoints are snapshots
    uploaded in the background either way."""
    seed: int = 0
    """Seed of the per-step RNG fork (dropout and any other randomness inside `loss_fn`): step s of rank r
    runs under a generator seeded from (seed, s, r), in the real pass and in any recompute of it."""
    grad_clip: float | None = None
    """Clip the averaged gradient's norm to this (None: no clipping). The norm is computed anyway: it is the
    averaged side of the finite check."""
    threads: int = 1
    """torch intra-op threads, pinned on every rank: the bits depend on it."""
    resume_from: str | None = None
    """Checkpoint reference to resume from (a path, or a store key)."""
    use_store: bool = True
    """Write records to the store the environment points at, besides the run dir."""
    store_flush_every: int = 20
    """Flush batched check records to the store every this many steps (also at checkpoints, alerts, exit)."""
    progress_interval_s: float = 5.0
    """Write the progress heartbeat to the store at most this often (the run dir gets it every step)."""
    collective_timeout_s: float = 300.0
    """Timeout of collectives (a hung rank makes the others fail after this)."""
    await_directive_s: float = 0.0
    """A warm standby (training.spares.standby): wait this long for the directive of this attempt before loading
    anything, and resume from its checkpoint (0: start at once)."""

    def __post_init__(self) -> None:
        check_run_name(self.run)
        _positive("steps", self.steps)
        _non_negative("checkpoint_every", self.checkpoint_every)
        _positive("threads", self.threads)
        _positive("store_flush_every", self.store_flush_every)
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip!r}")
        if not self.collective_timeout_s > 0:
            raise ValueError(f"collective_timeout_s must be > 0, got {self.collective_timeout_s!r}")
        if not 0 <= self.await_directive_s <= 3600:
            raise ValueError(f"await_directive_s must be in [0, 3600], got {self.await_directive_s!r}")
        if self.await_directive_s and self.resume_from:
            raise ValueError(
                "await_directive_s and resume_from exclude each other: the directive names the checkpoint"
            )
        if not self.progress_interval_s >= 0:
            raise ValueError(f"progress_interval_s must be >= 0, got {self.progress_interval_s!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> GuardConfig:
        """The settings longrun's launch exported (`ENV_*`), then `overrides` (keyword arguments named as the
        fields; `checks` as a CheckConfig). Outside longrun's launch `run_dir` and `steps` must come from
        one of the two; the run name defaults to the run dir's name."""
        return cls(**settings_from_env(env, overrides))


def settings_from_env(env: Mapping[str, str] | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a GuardConfig (or a subclass) from the environment and `overrides`."""
    env = dict(os.environ if env is None else env)
    values: dict[str, Any] = {}
    if env.get(ENV_RUN_DIR):
        values["run_dir"] = Path(env[ENV_RUN_DIR])
    if env.get(ENV_RUN_NAME):
        values["run"] = env[ENV_RUN_NAME]
    for key, name in (("steps", ENV_STEPS), ("checkpoint_every", ENV_CHECKPOINT_EVERY), ("seed", ENV_SEED)):
        value = env_int(env, name, None)
        if value is not None:
            values[key] = value
    if env.get(ENV_RESUME_FROM, "").strip():
        values["resume_from"] = env[ENV_RESUME_FROM].strip()
    wait = env_float(env, ENV_AWAIT_DIRECTIVE_S, 0.0)
    if wait:
        values["await_directive_s"] = wait
    values.update(overrides)
    if "checks" not in overrides:
        base = CheckConfig()
        values["checks"] = CheckConfig(
            recompute_every=env_int(env, ENV_RECOMPUTE_EVERY, base.recompute_every) or 0,
            vote_every=env_int(env, ENV_VOTE_EVERY, base.vote_every) or 0,
        )
    for required, name in (("run_dir", ENV_RUN_DIR), ("steps", ENV_STEPS)):
        if values.get(required) is None:
            raise ValueError(
                f"{required} is not set: export {name} (longrun's launch does) or pass {required}="
            )
    values["run_dir"] = Path(values["run_dir"])
    values.setdefault("run", Path(values["run_dir"]).resolve().name)
    return values


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig(GuardConfig):
    """One run of the reference trainer: a guarded run plus its model and learning rate."""

    model: ModelConfig
    """Model shape."""
    lr: float = 3e-3
    """AdamW learning rate."""
    parallelism: str = "ddp"
    """How the model is spread over the ranks (PARALLELISMS): `ddp` through `Guard.prepare`, `fsdp` and
    `hsdp` through `Guard.prepare_sharded` on `Guard.device_mesh(parallelism)`."""

    def __post_init__(self) -> None:
        GuardConfig.__post_init__(self)
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.parallelism not in PARALLELISMS:
            raise ValueError(
                f"parallelism must be one of {', '.join(PARALLELISMS)}, got {self.parallelism!r}"
            )
