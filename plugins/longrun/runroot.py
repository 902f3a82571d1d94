"""The run root: the directory that holds every run's directory (`<root>/<run>`), visible on every node;
and the job user, who writes it.

`LONGRUN_JOB_USER` names the unprivileged Unix user jobs run as (`job_user`; longrun.slurm.job_user
submits as it), so that a job cannot do what the orchestrator does. Unset, jobs run as the orchestrator's
own user. The jobs write their run dirs, so the root belongs to whoever they run as.

`LONGRUN_RUN_ROOT` names the root (the local stack sets `<state dir>/runs`, owned by its job user); a site
that sets it chose it, and it is used as it is (only created when missing: 0700 and the job user's, with
one). Without it the root is `<tmp>/longrun-runs`, in a directory every local user may write: another user
could create it first and then read or replace what runs write there (records, fault state, the
entrypoint's outputs). So the default root is used only when its owner is the one the jobs run as (the job
user, else this user) and no one else may write it: it is created with mode 0700 and given to that owner
when missing, and one that is a link, not a directory, someone else's, or writable by group or others
(sticky bit or not: others could still create a run's directory in it before the run) is refused, naming
`LONGRUN_RUN_ROOT`. A default root this user made before a job user was set is handed to the job user.
"""

from __future__ import annotations

import os
import pwd
import stat
import tempfile
from collections.abc import Mapping

from longrun.slurm import validate as v

ENV = "LONGRUN_RUN_ROOT"
JOB_USER_ENV = "LONGRUN_JOB_USER"
DEFAULT_NAME = "longrun-runs"


class RunRootError(RuntimeError):
    """The default run root cannot be trusted; the message says why and what to set."""


def default_run_root() -> str:
    return os.path.join(tempfile.gettempdir(), DEFAULT_NAME)


def job_user(env: Mapping[str, str] | None = None) -> str | None:
    """The Unix user jobs run as (`LONGRUN_JOB_USER`), or None (unset or empty: the orchestrator's own
    user). Raises InvalidSpecError, naming the variable, for anything but a plain user name other than root."""
    env = os.environ if env is None else env
    name = env.get(JOB_USER_ENV) or None
    return None if name is None else v.unix_user(JOB_USER_ENV, name)


def run_root(env: Mapping[str, str] | None = None) -> str:
    """`LONGRUN_RUN_ROOT` as set, or the default root once it checks out (`ensure_run_root`) for the job
    user, if one is set."""
    env = os.environ if env is None else env
    return env.get(ENV) or ensure_run_root(default_run_root(), owner=job_user(env))


def make_missing_root(path: str, owner: str | None) -> None:
    """Create a root the site named but that does not exist yet: 0700 and `owner`'s when jobs run as a job
    user (they write it), else as `os.makedirs` makes it. An existing root is left as it is."""
    if os.path.isdir(path):
        return
    if owner is None:
        os.makedirs(path, exist_ok=True)
        return
    os.makedirs(os.path.dirname(path.rstrip("/")) or "/", exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    os.chown(path, *_ids(owner))


def _ids(user: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise RunRootError(f"the job user {user!r} ({JOB_USER_ENV}) does not exist on this host") from None
    return entry.pw_uid, entry.pw_gid


def ensure_run_root(path: str, owner: str | None = None) -> str:
    """`path`, created 0700 when missing; refused unless it is a directory of the jobs' user (`owner`, the
    job user; None: this user) that nobody else may write. With an owner, this user must be root (it hands
    the root over), and a root this user made is handed over too."""
    uid, gid = (os.geteuid(), os.getegid()) if owner is None else _ids(owner)
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
    if owner is not None and st.st_uid == os.geteuid() != uid:
        # ours (just made, or from before the job user): the jobs write it, so it is theirs
        try:
            os.chown(path, uid, gid, follow_symlinks=False)
        except PermissionError as err:
            raise RunRootError(
                f"run root {path} must belong to the job user {owner}, and only root can hand it over: {fix}"
            ) from err
        st = os.lstat(path)
    if st.st_uid != uid:
        whose = "this user" if owner is None else f"the job user {owner}"
        raise RunRootError(
            f"run root {path} is not owned by {whose} (uid {uid}) but by uid {st.st_uid}, who could"
            f" read and replace the runs' files: {fix}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RunRootError(
            f"run root {path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}), who could create a"
            f" run's directory in it first: {fix}"
        )
    return path
