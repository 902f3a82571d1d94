"""What a run launches, checked before anything reaches Slurm, and how longrun's settings reach it.

A run names its entrypoint as `module:<dotted.name>` (ft_launcher's `--module`) or `script:<path>` (a
Python file, ft_launcher's training script), a list of arguments for it (never a shell string: each is
one argv entry, quoted with shlex.quote in the batch script) and, optionally, the interpreter of the
job's Python environment (`job_python`; its `ft_launcher` sits beside it). The default entrypoint is the
reference trainer, `module:training.train`.

What a site allows is read from the Airflow worker's environment:

    LONGRUN_ENTRYPOINT_DIR  the directory every `script:` entrypoint must be inside (after symlinks are
                            resolved); unset: `script:` entrypoints are refused
    LONGRUN_JOB_PYTHONS     colon-separated absolute interpreters a run may name as `job_python`; unset:
                            only the default (the Airflow worker's own interpreter)

The settings reach any entrypoint (the reference trainer included) as environment variables that the
batch script exports (`JOB_ENV`, docs/contracts.md "The job's environment"). RunSpec calls `check`; the
Params form (dags/training_run.py) uses the patterns here for what JSON schema can refuse early.
Pure Python: no Airflow, no torch.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training.config import (
    ENV_AWAIT_DIRECTIVE_S,
    ENV_CHECKPOINT_EVERY,
    ENV_FAULTS,
    ENV_MODEL,
    ENV_PARALLELISM,
    ENV_RECOMPUTE_EVERY,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    ENV_RUN_NAME,
    ENV_SEED,
    ENV_STEPS,
    ENV_VOTE_EVERY,
)

#: The reference trainer (training/train.py).
REFERENCE = "module:training.train"
MODULE, SCRIPT = "module:", "script:"
#: A dotted Python module name: no shell characters, no spaces.
MODULE_NAME = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
#: An absolute, normalized path: segments of [A-Za-z0-9_.-], none of them `.` or `..`, no `//`, no
#: trailing `/`.
ABS_PATH = r"(/(?!\.\.?(/|$))[A-Za-z0-9_.-]+)+"
MAX_MODULE_CHARS = 256
MAX_PATH_CHARS = 1024
MAX_ARGS = 256
MAX_ARG_CHARS = 4096
#: Characters an argument may not hold: a NUL cannot be in an argv entry, and a line break would split a
#: line of the batch script that a person reads (quoting would keep it one argument all the same).
ARG_FORBIDDEN = "\x00\n\r"
#: JSON schema patterns for the Params form (Python's `re` and ECMAScript read them the same way).
ENTRYPOINT_PATTERN = rf"^({MODULE}{MODULE_NAME}|{SCRIPT}{ABS_PATH})$"
JOB_PYTHON_PATTERN = rf"^({ABS_PATH})?$"
ARG_PATTERN = r"^[^\x00\n\r]*$"

_MODULE = re.compile(rf"^{MODULE_NAME}$")
_ABS_PATH = re.compile(rf"^{ABS_PATH}$")

#: Site settings (the Airflow worker's environment).
ENTRYPOINT_DIR_ENV = "LONGRUN_ENTRYPOINT_DIR"
JOB_PYTHONS_ENV = "LONGRUN_JOB_PYTHONS"

# The job environment: what the batch script exports for the entrypoint. The names are the job side's
# (training.config reads them), defined there once.
#: Set for every launch.
ALWAYS_ENV = (
    ENV_RUN_NAME, ENV_RUN_DIR, ENV_STEPS, ENV_CHECKPOINT_EVERY, ENV_RECOMPUTE_EVERY, ENV_VOTE_EVERY, ENV_SEED,
    ENV_PARALLELISM,
)  # fmt: skip
#: Set only sometimes (MODEL: the reference trainer; FAULTS: a drill's first launch; RESUME_FROM: a resume;
#: AWAIT_DIRECTIVE_S: a hot-spare standby). The script unsets them before it decides, so none can come
#: from anywhere else.
SOMETIMES_ENV = (ENV_MODEL, ENV_FAULTS, ENV_RESUME_FROM, ENV_AWAIT_DIRECTIVE_S)
JOB_ENV = (*ALWAYS_ENV, *SOMETIMES_ENV)


class EntrypointError(ValueError):
    """An entrypoint field is invalid: `field`, `value` and `why` (RunSpec turns it into a RunSpecError)."""

    def __init__(self, field_name: str, value: Any, why: str) -> None:
        super().__init__(f"{field_name}={value!r}: {why}")
        self.field = field_name
        self.value = value
        self.why = why


@dataclass(frozen=True, slots=True)
class Site:
    """What the site allows: the directory of `script:` entrypoints and the job interpreters."""

    entrypoint_dir: str | None = None
    """LONGRUN_ENTRYPOINT_DIR, as set (None: unset or empty)."""
    job_pythons: tuple[str, ...] = ()
    """LONGRUN_JOB_PYTHONS, split at `:` (empty entries dropped)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Site:
        env = os.environ if env is None else env
        pythons = tuple(p for p in (env.get(JOB_PYTHONS_ENV) or "").split(":") if p)
        return cls(entrypoint_dir=env.get(ENTRYPOINT_DIR_ENV) or None, job_pythons=pythons)


def split(entrypoint: str) -> tuple[str, str]:
    """("module", name) or ("script", path) of a checked entrypoint."""
    kind, _, target = entrypoint.partition(":")
    return kind, target


def is_reference(entrypoint: str) -> bool:
    return entrypoint == REFERENCE


def _inside(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def check_entrypoint(value: object, site: Site) -> str:
    """`value` if it is a valid entrypoint for this site, else EntrypointError naming `entrypoint`."""
    name = "entrypoint"
    if not isinstance(value, str):
        raise EntrypointError(name, value, "must be a string: module:<dotted.name> or script:<path>")
    if value.startswith(MODULE):
        module = value[len(MODULE) :]
        if len(module) > MAX_MODULE_CHARS or not _MODULE.match(module):
            raise EntrypointError(
                name,
                value,
                f"module:<name> needs a dotted Python module name ({MODULE_NAME}, <= {MAX_MODULE_CHARS})",
            )
        return value
    if not value.startswith(SCRIPT):
        raise EntrypointError(name, value, "must start with module: or script:")
    path = value[len(SCRIPT) :]
    if len(path) > MAX_PATH_CHARS or not _ABS_PATH.match(path):
        raise EntrypointError(
            name,
            value,
            "script:<path> needs an absolute, normalized path (no '.', '..', '//' or trailing '/') of "
            f"[A-Za-z0-9_.-] segments, <= {MAX_PATH_CHARS} characters",
        )
    if site.entrypoint_dir is None:
        raise EntrypointError(
            name,
            value,
            f"script: entrypoints are refused here: the site has not set {ENTRYPOINT_DIR_ENV} (on the Airflow "
            "workers: the directory every script entrypoint must be inside)",
        )
    root = site.entrypoint_dir
    if not root.startswith("/") or os.path.normpath(root) != root.rstrip("/") or root == "/":
        raise EntrypointError(
            name, value, f"the site's {ENTRYPOINT_DIR_ENV}={root!r} is not a normalized absolute directory"
        )
    if not _inside(path, root):
        raise EntrypointError(name, value, f"is not inside {ENTRYPOINT_DIR_ENV} ({root})")
    # Symlinks (of the script or of a directory on its way) must not lead out: resolve what exists.
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    if not _inside(real, real_root):
        raise EntrypointError(name, value, f"resolves to {real}, outside {ENTRYPOINT_DIR_ENV} ({real_root})")
    if os.path.isdir(real):
        raise EntrypointError(name, value, "is a directory, not a script")
    return value


def check_args(value: object) -> tuple[str, ...]:
    """The arguments as a tuple, else EntrypointError naming `entrypoint_args`."""
    name = "entrypoint_args"
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise EntrypointError(
            name, value, "must be a list of strings (one per argument), never a shell string"
        )
    if len(value) > MAX_ARGS:
        raise EntrypointError(name, f"<{len(value)} arguments>", f"at most {MAX_ARGS} arguments")
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            raise EntrypointError(f"{name}[{i}]", arg, "must be a string")
        if len(arg) > MAX_ARG_CHARS:
            raise EntrypointError(f"{name}[{i}]", f"{arg[:40]}...", f"longer than {MAX_ARG_CHARS} characters")
        if any(c in arg for c in ARG_FORBIDDEN):
            raise EntrypointError(f"{name}[{i}]", arg, "must not hold a NUL, newline or carriage return")
    return tuple(value)


def check_job_python(value: object, site: Site) -> str:
    """`value` ("" = the default interpreter) if the site allows it, else EntrypointError naming `job_python`."""
    name = "job_python"
    if not isinstance(value, str):
        raise EntrypointError(name, value, "must be a string (empty: the Airflow worker's interpreter)")
    if not value:
        return value
    if len(value) > MAX_PATH_CHARS or not _ABS_PATH.match(value):
        raise EntrypointError(name, value, "must be an absolute, normalized path of [A-Za-z0-9_.-] segments")
    if not site.job_pythons:
        raise EntrypointError(
            name,
            value,
            f"only the default interpreter is allowed: the site lists others in {JOB_PYTHONS_ENV} (colon-separated)",
        )
    if value not in site.job_pythons:
        raise EntrypointError(
            name, value, f"is not one of the site's {JOB_PYTHONS_ENV}: {list(site.job_pythons)}"
        )
    return value


def check(
    entrypoint: object, args: object, job_python: object, site: Site | None = None
) -> tuple[str, tuple[str, ...], str]:
    """All three fields, checked against the site (default: this process's environment)."""
    site = Site.from_env() if site is None else site
    return check_entrypoint(entrypoint, site), check_args(args), check_job_python(job_python, site)


def launcher_args(entrypoint: str, args: Sequence[str]) -> str:
    """What follows ft_launcher's own options: `--module <name>` or the script's path, then the arguments,
    each quoted for bash (so `$(...)`, quotes and spaces arrive as literal text, one argv entry each)."""
    kind, target = split(entrypoint)
    head = ["--module", target] if kind == "module" else [target]
    return " ".join(shlex.quote(a) for a in (*head, *args))


def export_lines(env: Mapping[str, str]) -> list[str]:
    """`export NAME=value` per item, values quoted."""
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
