"""The run root: the directory that holds every run's directory (`<root>/<run>`), visible on every node.

`LONGRUN_RUN_ROOT` names it (the local stack sets `<state dir>/runs`); a site that sets it chose it, and it
is used as it is. Without it the root is `<tmp>/longrun-runs`, in a directory every local user may write:
another user could create it first and then read or replace what runs write there (records, fault state,
the entrypoint's outputs). So the default root is used only when this user made it and no one else may
write it: it is created with mode 0700 when missing (jobs run as the orchestrator's user today), and one
that is a link, not a directory, another user's, or writable by group or others (sticky bit or not:
others could still create a run's directory in it before the run) is refused, naming `LONGRUN_RUN_ROOT`.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping

ENV = "LONGRUN_RUN_ROOT"
DEFAULT_NAME = "longrun-runs"


class RunRootError(RuntimeError):
    """The default run root cannot be trusted; the message says why and what to set."""


def default_run_root() -> str:
    return os.path.join(tempfile.gettempdir(), DEFAULT_NAME)


def run_root(env: Mapping[str, str] | None = None) -> str:
    """`LONGRUN_RUN_ROOT` as set, or the default root once it checks out (`ensure_run_root`)."""
    env = os.environ if env is None else env
    return env.get(ENV) or ensure_run_root(default_run_root())


def ensure_run_root(path: str) -> str:
    """`path`, created 0700 when missing; refused unless it is a directory of this user's that nobody
    else may write."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    fix = f"set {ENV} to a directory of your own, visible on every node, or remove {path}"
    if stat.S_ISLNK(st.st_mode):
        raise RunRootError(f"run root {path} is a symbolic link, which another user may have planted: {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise RunRootError(f"run root {path} is not a directory: {fix}")
    if st.st_uid != os.geteuid():
        raise RunRootError(
            f"run root {path} is not owned by this user (uid {os.geteuid()}) but by uid {st.st_uid}, who could"
            f" read and replace the runs' files: {fix}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RunRootError(
            f"run root {path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}), who could create a"
            f" run's directory in it first: {fix}"
        )
    return path
