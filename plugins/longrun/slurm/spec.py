"""The typed job spec that `render.render_sbatch` turns into an sbatch script, and the job tag.

Every field is validated in `__post_init__` (see `validate.py`): what reaches sbatch is either an allow-listed
value or, for `command`, a line of the script body that the DAG author wrote.

Trust boundary: `command` lines are shell code by design (pipes and `$VAR` are the point of a script), so
they are checked only for what would break the script's structure (newlines, NUL, `#SBATCH` lines). Values
that come from users (Params, connection extras) belong in the validated fields, above all `env`, which
the script exports quoted, not in `command`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from longrun.slurm import validate as v
from longrun.slurm.errors import InvalidSpecError

TAG_ROOT = "longrun"
MAX_NODES = 4096
MAX_TASKS_PER_NODE = 1024
MAX_GPUS_PER_NODE = 64
MAX_TIME_LIMIT_MIN = 30 * 24 * 60
MAX_COMMAND_LINES = 256
MAX_LINE = 4096
#: What every job gets from the submitting environment (`--export`): enough to run a shell, Python and
#: Slurm's commands. Nothing else of the Airflow worker's environment reaches a job.
BASE_EXPORT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SLURM_CONF")


@dataclass(frozen=True, kw_only=True, slots=True)
class JobTag:
    """Who submitted a job: written to `--comment` so a retried task finds its job instead of submitting twice."""

    dag_id: str
    """Airflow DAG id."""
    run_id: str
    """Airflow DAG run id."""
    task_id: str
    """Airflow task id."""
    map_index: int = -1
    """Mapped task index (-1 when not mapped)."""
    try_number: int = 1
    """The task try that submitted the job; reattaching ignores it (any try of the same task instance)."""

    def __post_init__(self) -> None:
        for f in ("dag_id", "run_id", "task_id"):
            value = getattr(self, f)
            v.tag(f, value)
            if "/" in value:
                raise InvalidSpecError(f, value, "must not contain '/' (the tag separator)")
        v.int_range("map_index", self.map_index, -1, 1_000_000)
        v.int_range("try_number", self.try_number, 0, 10_000)

    def prefix(self) -> str:
        """The tag without the try: every try of this task instance shares it."""
        return f"{TAG_ROOT}/{self.dag_id}/{self.run_id}/{self.task_id}/{self.map_index}/"

    def render(self) -> str:
        return f"{self.prefix()}{self.try_number}"

    @classmethod
    def parse(cls, text: str) -> JobTag | None:
        """The tag in a job comment, or None when the comment is not one of ours."""
        parts = text.split("/")
        if len(parts) != 6 or parts[0] != TAG_ROOT:
            return None
        try:
            return cls(
                dag_id=parts[1],
                run_id=parts[2],
                task_id=parts[3],
                map_index=int(parts[4]),
                try_number=int(parts[5]),
            )
        except (ValueError, InvalidSpecError):
            return None


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """One Slurm batch job, as longrun submits it."""

    name: str
    """Job name (`--job-name`)."""
    partition: str
    """Partition (`--partition`)."""
    command: tuple[str, ...]
    """Lines of the script body, run by bash in order (shell code written by the DAG author)."""
    comment: str
    """The tag written to `--comment` (normally `JobTag.render()`); finding a job by tag reads it back."""
    nodes: int = 1
    """Number of nodes (`--nodes`)."""
    ntasks_per_node: int = 1
    """Tasks per node (`--ntasks-per-node`)."""
    gpus_per_node: int = 8
    """GPUs per node; 0 means a CPU job and no `--gres` line."""
    gpu_type: str = "h100"
    """GPU gres type: `--gres=gpu:<gpu_type>:<gpus_per_node>`."""
    exclusive: bool = True
    """Whole nodes (`--exclusive`)."""
    time_limit_min: int = 60
    """Wall-clock limit in minutes (`--time`)."""
    exclude: tuple[str, ...] = ()
    """Nodes the job must not run on (`--exclude`), e.g. a node under suspicion."""
    nodelist: tuple[str, ...] = ()
    """Nodes the job must run on (`--nodelist`)."""
    reservation: str | None = None
    """Reservation to run in (`--reservation`), e.g. the MAINT reservation of a diagnosis."""
    workdir: str | None = None
    """Working directory (`--chdir`); None keeps sbatch's default (the submitting directory)."""
    output: str | None = None
    """stdout and stderr file (`--output`, appended to); may use sbatch's `%j`-style patterns."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables the script exports before `command`, single-quoted."""
    requeue: bool = True
    """`--requeue` (Slurm may restart the job after a node failure) or `--no-requeue`."""
    export: tuple[str, ...] = BASE_EXPORT
    """Names the job takes from the submitting environment (`--export`, an allow-list; values are not in
    the script). Secrets handed to `submit(secret_env=...)` are added by name at submit."""
    run_as: str | None = None
    """The Unix user the job runs as (`longrun.slurm.job_user`: sbatch runs under that user's identity, so
    Slurm gives the job that user's rights, not the orchestrator's); None: the submitting user. Not in the
    script: it decides who submits, and the job cannot change it."""

    def __post_init__(self) -> None:
        v.name("name", self.name)
        v.name("partition", self.partition)
        v.tag("comment", self.comment)
        v.int_range("nodes", self.nodes, 1, MAX_NODES)
        v.int_range("ntasks_per_node", self.ntasks_per_node, 1, MAX_TASKS_PER_NODE)
        v.int_range("gpus_per_node", self.gpus_per_node, 0, MAX_GPUS_PER_NODE)
        v.gpu_type("gpu_type", self.gpu_type)
        v.int_range("time_limit_min", self.time_limit_min, 1, MAX_TIME_LIMIT_MIN)
        for f in ("exclusive", "requeue"):
            if not isinstance(getattr(self, f), bool):
                raise InvalidSpecError(f, getattr(self, f), "must be True or False")
        # Normalise lists to tuples so the spec is immutable and compares by value.
        object.__setattr__(self, "exclude", v.nodes("exclude", self.exclude))
        object.__setattr__(self, "nodelist", v.nodes("nodelist", self.nodelist))
        if clash := sorted(set(self.exclude) & set(self.nodelist)):
            raise InvalidSpecError("exclude", self.exclude, f"also in nodelist: {clash}")
        if len(self.nodelist) > self.nodes:
            raise InvalidSpecError("nodelist", self.nodelist, f"names more nodes than nodes={self.nodes}")
        if self.reservation is not None:
            v.name("reservation", self.reservation)
        if self.workdir is not None:
            v.path("workdir", self.workdir)
            if not self.workdir.startswith("/"):
                raise InvalidSpecError("workdir", self.workdir, "must be an absolute path")
        if self.output is not None:
            v.path("output", self.output)
        if not isinstance(self.env, Mapping):
            raise InvalidSpecError("env", self.env, "must be a mapping of names to values")
        if len(self.env) > 256:
            raise InvalidSpecError("env", f"<{len(self.env)} variables>", "at most 256 variables")
        env = {v.env_name("env", k): v.env_value(f"env[{k}]", val) for k, val in self.env.items()}
        object.__setattr__(self, "env", env)
        if isinstance(self.export, str) or not isinstance(self.export, list | tuple) or not self.export:
            raise InvalidSpecError("export", self.export, "must be a non-empty list of variable names")
        export = tuple(dict.fromkeys(v.export_name("export", n) for n in self.export))
        if leaked := sorted(n for n in env if n.upper().startswith(v.FORBIDDEN_EXPORT_PREFIXES)):
            raise InvalidSpecError("env", leaked, "Airflow's configuration and secrets never reach a job")
        object.__setattr__(self, "export", export)
        object.__setattr__(self, "command", self._check_command(self.command))
        if self.run_as is not None:
            v.unix_user("run_as", self.run_as)

    @staticmethod
    def _check_command(lines: object) -> tuple[str, ...]:
        if isinstance(lines, str) or not isinstance(lines, list | tuple):
            raise InvalidSpecError("command", lines, "must be a list of script lines")
        if not 1 <= len(lines) <= MAX_COMMAND_LINES:
            raise InvalidSpecError("command", f"<{len(lines)} lines>", f"needs 1-{MAX_COMMAND_LINES} lines")
        for i, line in enumerate(lines):
            f = f"command[{i}]"
            if not isinstance(line, str):
                raise InvalidSpecError(f, line, "must be a string")
            if len(line) > MAX_LINE:
                raise InvalidSpecError(f, line[:40] + "...", f"longer than {MAX_LINE} characters")
            if any(c in line for c in "\n\r\0"):
                raise InvalidSpecError(f, line, "must be one line (no newline, carriage return or NUL)")
            if line.lstrip().upper().startswith("#SBATCH"):
                raise InvalidSpecError(f, line, "must not be an #SBATCH directive (set the spec's fields)")
        return tuple(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (for XCom and trigger kwargs)."""
        d = asdict(self)
        d["command"] = list(self.command)
        d["exclude"] = list(self.exclude)
        d["nodelist"] = list(self.nodelist)
        d["env"] = dict(self.env)
        d["export"] = list(self.export)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        unknown = set(data) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise InvalidSpecError("spec", sorted(unknown), "unknown field(s)")
        data = dict(data)
        if isinstance(data.get("export"), list):
            data["export"] = tuple(data["export"])
        return cls(**data)
