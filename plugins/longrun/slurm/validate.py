"""Validators for every value that reaches a Slurm command line or an sbatch script.

Each returns the value unchanged or raises InvalidSpecError naming the field and the value. They are
allow-lists: a value must match a small character set, so shell metacharacters, newlines, option
injection (a leading `-`) and path traversal fail by construction rather than by a deny-list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from longrun.slurm.errors import InvalidSpecError
from training.records.schema import DRAIN_PREFIX  # one definition; `reason()` below enforces it

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_GPU_TYPE = re.compile(r"[a-z0-9][a-z0-9_]{0,31}")
# Airflow run ids use [A-Za-z0-9_.~:+-]; the tag joins dag/run/task/map/try with '/'.
_TAG = re.compile(r"[A-Za-z0-9_.~:+/=@,-]{1,512}")
_PATH = re.compile(r"[A-Za-z0-9_./%-]{1,1024}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Environment values: printable, no quoting or expansion characters; a space is fine (we quote).
_ENV_VALUE = re.compile(r"[A-Za-z0-9_.,:/=@+% -]{0,4096}")
# Drain reasons: free text for people, but nothing a shell or scontrol's key=value parser treats specially.
_REASON = re.compile(r"[A-Za-z0-9_.,:/@+ -]{1,256}")
# Unix user names as `useradd` accepts them by default (Debian's NAME_REGEX, without the trailing `$` of
# machine accounts): the name reaches a command line (`setpriv`) and a passwd lookup.
_UNIX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")

MAX_LIST = 4096

#: Words Slurm reads as something other than one node (`scontrol update NodeName=ALL` is every node).
NODE_KEYWORDS = frozenset({"all", "none", "any", "localhost"})
#: Environment name prefixes that never reach a job: Airflow's configuration and secrets.
FORBIDDEN_EXPORT_PREFIXES = ("AIRFLOW", "_AIRFLOW")


def _match(field: str, value: object, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str):
        raise InvalidSpecError(field, value, f"must be a string ({what})")
    if pattern.fullmatch(value) is None:
        raise InvalidSpecError(field, value, f"must be {what}")
    return value


def name(field: str, value: object) -> str:
    """A job, partition or reservation name."""
    return _match(field, value, _NAME, "1-64 of [A-Za-z0-9_.-], starting with a letter or digit")


def node(field: str, value: object) -> str:
    """One node name: no hostlist or node-set expression (`n[1-3]`, `n1,n2`; the pattern refuses them)
    and no Slurm keyword (`ALL`), so an operation meant for one node never reaches many."""
    _match(field, value, _NODE, "a node name: 1-64 of [A-Za-z0-9_-], starting with a letter or digit")
    assert isinstance(value, str)
    if value.lower() in NODE_KEYWORDS:
        raise InvalidSpecError(field, value, "is a Slurm keyword, not a node name")
    return value


def nodes(field: str, values: Iterable[object]) -> tuple[str, ...]:
    """A list of plain node names, without duplicates."""
    if isinstance(values, str):
        raise InvalidSpecError(field, values, "must be a list of node names, not one string")
    out = tuple(node(field, v) for v in values)
    if len(out) > MAX_LIST:
        raise InvalidSpecError(field, f"<{len(out)} names>", f"at most {MAX_LIST} nodes")
    if len(set(out)) != len(out):
        raise InvalidSpecError(field, out, "lists a node twice")
    return out


def gpu_type(field: str, value: object) -> str:
    return _match(field, value, _GPU_TYPE, "a gres type: 1-32 of [a-z0-9_]")


def tag(field: str, value: object) -> str:
    """The `--comment` tag: no spaces, no quoting, not an option."""
    _not_option(field, value)
    return _match(field, value, _TAG, "1-512 of [A-Za-z0-9_.~:+/=@,-]")


def path(field: str, value: object) -> str:
    """A file system path for sbatch (`--chdir`, `--output`): no `..`, no spaces or quoting."""
    _not_option(field, value)
    _match(field, value, _PATH, "a path of [A-Za-z0-9_./%-] (1-1024 characters)")
    assert isinstance(value, str)
    if ".." in value.split("/"):
        raise InvalidSpecError(field, value, "must not contain a '..' component (path traversal)")
    return value


def env_name(field: str, value: object) -> str:
    return _match(field, value, _ENV_NAME, "an environment variable name ([A-Za-z_][A-Za-z0-9_]*, <=128)")


def export_name(field: str, value: object) -> str:
    """A variable name the job receives from the submitting environment (`--export`): never Airflow's."""
    env_name(field, value)
    assert isinstance(value, str)
    if value.upper().startswith(FORBIDDEN_EXPORT_PREFIXES):
        raise InvalidSpecError(field, value, "Airflow's configuration and secrets never reach a job")
    return value


def secret_env(field: str, values: Mapping[str, object] | None) -> dict[str, str]:
    """Secrets a job receives by name from the submitting process's environment (never through its
    script): exportable names, one-line string values. The values are never echoed in an error."""
    out: dict[str, str] = {}
    for key, val in (values or {}).items():
        export_name(field, key)
        if not isinstance(val, str) or any(c in val for c in "\n\r\0"):
            raise InvalidSpecError(f"{field}[{key}]", "<hidden>", "must be a one-line string")
        out[key] = val
    return out


def env_value(field: str, value: object) -> str:
    return _match(
        field, value, _ENV_VALUE, "printable [A-Za-z0-9_.,:/=@+% -] only (<=4096; no quotes, $, `, ;, |, &)"
    )


def reason(field: str, value: object, *, ours: bool = True) -> str:
    """A drain reason; with `ours`, it must carry longrun's prefix."""
    _match(field, value, _REASON, "1-256 of [A-Za-z0-9_.,:/@+ -]")
    assert isinstance(value, str)
    if ours and not value.startswith(DRAIN_PREFIX):
        raise InvalidSpecError(
            field, value, f"must start with {DRAIN_PREFIX!r}: longrun only drains with its prefix"
        )
    return value


def unix_user(field: str, value: object) -> str:
    """The Unix user a job runs as: a plain user name, never root (a job as root could do everything the
    orchestrator does, which is what naming a job user is meant to prevent)."""
    _match(field, value, _UNIX_USER, "a Unix user name: 1-32 of [a-z0-9_-], starting with a letter or '_'")
    if value == "root":
        raise InvalidSpecError(field, value, "a job never runs as root: name an unprivileged user")
    assert isinstance(value, str)
    return value


def int_range(field: str, value: object, lo: int, hi: int) -> int:
    """An int in [lo, hi]; bool is refused (True is an int in Python, never a size here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpecError(field, value, "must be an integer")
    if not lo <= value <= hi:
        raise InvalidSpecError(field, value, f"must be between {lo} and {hi}")
    return value


def _not_option(field: str, value: object) -> None:
    if isinstance(value, str) and value.startswith("-"):
        raise InvalidSpecError(field, value, "must not start with '-' (option injection)")
