"""Submitting a job as an unprivileged Unix user: the job's identity, apart from the orchestrator's.

Slurm runs a batch job as the user whose sbatch submitted it, with that user's rights. A job the
orchestrator submits as itself (root, or Slurm's operator) could do what the orchestrator does: drain and
resume nodes, delete reservations, cancel any job, step into any job (`srun --jobid=... --overlap`) and read
its environment. A job that names a user (`JobSpec.run_as`) is therefore submitted by sbatch running as
that user: the orchestrator starts sbatch through `setpriv`, which sets the real and effective uid and gid
and that user's groups and then execs sbatch, without PAM or a login shell and with the environment the
caller gives it (so the secrets sbatch exports by name stay in sbatch's environment alone). Slurm's
authentication (munge) then names that user, and the job gets exactly that user's rights. This works on
every Slurm version (`sbatch --uid` exists in 22.05 but not in 25.11). Cancelling, draining, resuming,
reservations and diagnostic steps in a reservation stay the orchestrator's own calls. A step inside a
running job (`srun --jobid`) is the one exception: Slurm creates a step only for the job's own user (root
included, 22.05 answers "Access/permission denied"), so the orchestrator starts that srun as the job's
owner; such a step runs with the job's rights and beside its processes anyway (docs/security.md, item 5).

Switching users needs root: an orchestrator that is not root cannot submit as another user and says so.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from longrun.slurm import validate as v
from longrun.slurm.errors import InvalidSpecError, SubmitRejectedError


@dataclass(frozen=True, slots=True, kw_only=True)
class JobUser:
    """A Unix user a job may run as, as this host's user database names it."""

    name: str
    """The user name (`JobSpec.run_as`)."""
    uid: int
    """Its user id (never 0)."""
    gid: int
    """Its primary group id."""
    home: str
    """Its home directory as the user database gives it (`HOME` of the job; it may not exist)."""


def resolve(name: str) -> JobUser:
    """The user `name` from this host's user database. Raises InvalidSpecError for a name that is not a
    plain user name, is root, does not exist here, or has uid 0. The user must exist, with the same uid, on
    every node as well: Slurm runs the job's processes under that uid there."""
    v.unix_user("run_as", name)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise InvalidSpecError(
            "run_as", name, "no such Unix user on this host (it must exist here and on every node)"
        ) from None
    if entry.pw_uid == 0:
        raise InvalidSpecError("run_as", name, "has uid 0: that is root under another name")
    return JobUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)


def of_uid(uid: int) -> JobUser | None:
    """The user with id `uid` (the owner of a job, as Slurm reports it), or None when that is this
    process's own user or root: a step of that user's job is then started as this process."""
    if uid in (0, os.geteuid()):
        return None
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        raise SubmitRejectedError(
            f"uid {uid} (the job's owner) is not in this host's user database"
        ) from None
    return JobUser(name=entry.pw_name, uid=uid, gid=entry.pw_gid, home=entry.pw_dir)


def as_user_prefix(user: JobUser) -> list[str]:
    """The argv prefix that runs the command after it as `user` (`setpriv`, exec, no shell), or [] when
    this process already is that user. Raises SubmitRejectedError when this process is not root: only root
    may take another user's identity."""
    euid = os.geteuid()
    if euid == user.uid:
        return []
    if euid != 0:
        raise SubmitRejectedError(
            f"cannot submit as job user {user.name!r}: the orchestrator runs as uid {euid}, and only root may"
            " start sbatch as another user (run the orchestrator as root, or leave the job user unset)"
        )
    return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", "--"]


def login_env(user: JobUser) -> dict[str, str]:
    """`USER`, `LOGNAME` and `HOME` of `user`: sbatch hands these names to the job (`BASE_EXPORT`), which
    would otherwise see the orchestrator's."""
    return {"USER": user.name, "LOGNAME": user.name, "HOME": user.home}
