"""What the local stack's jobs may reach: the job user they run as, and the modes of the state dir.

The orchestrator (Airflow's workers, and whoever runs `longrun stack up`) runs as root, which is also
Slurm's `SlurmUser`: it drains, resumes, reserves and cancels. A job submitted as root could do all of that
too, and read every secret under the state dir. So the stack runs jobs as an unprivileged user
(`Layout.job_user`, created here when missing: a system account without a login shell or a home directory)
and Airflow's workers submit as that user (`LONGRUN_JOB_USER`, longrun.slurm.job_user). What a job of that user may
reach under the state dir (`open_to_jobs`):

- the state dir itself: 0711, searchable but not listable, so a job finds `slurm/slurm.conf` (Slurm's
  commands need it) and `munge/munge.socket` (they authenticate through it);
- `slurm/` and `munge/`: 0755 as the daemons make them; their secrets are 0600 files or 0700 dirs (the
  munge key, the controller's saved jobs with their scripts and environments, the daemons' logs);
- `s3/` and `airflow/`: 0700, since they hold the store's keys and data files (the orchestrator's records,
  the alert keys among them), Airflow's secrets, passwords and database; `postgres/` is 0700 already;
- `runs/` (the run root Airflow's workers use): owned by the job user, 0700, so its jobs write their run
  dirs, logs and fault state there.

The modes are set on every start, with or without a job user: nothing but the stack's own daemons needs
more. A job user must also be able to run the jobs' interpreter (the virtual environment's Python and
everything under it); `check_job_user_runs` says what is in the way.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

from .layout import Layout, check_job_user
from .procs import StackError

JOB_USER_ENV = "LONGRUN_JOB_USER"
"""The orchestrator's setting of the job user (read by longrun.runroot), set in Airflow's environment."""
PRIVATE_DIRS = ("s3", "airflow")
"""Component dirs no job may enter: the store's keys and data, Airflow's secrets and database."""
NOLOGIN = "/usr/sbin/nologin"
NO_HOME = "/nonexistent"
CHECK_TIMEOUT_S = 60.0
MAX_LINK_HOPS = 40
"""Links followed by `_first_unsearchable` before it stops (Linux's own limit for a path's links)."""


def ensure_user(name: str) -> pwd.struct_passwd:
    """The user `name`, created first when missing (`useradd --system`: a group of its own, no home
    directory, no login shell). Creating one needs root; an existing one is used as it is."""
    check_job_user(name)
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    if os.geteuid() != 0:
        raise StackError(f"job user {name!r} does not exist, and only root can create it (useradd --system)")
    argv = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", NO_HOME]
    out = subprocess.run(
        [*argv, "--shell", NOLOGIN, name], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S
    )
    if out.returncode != 0 and "already exists" not in out.stderr:
        raise StackError(f"useradd {name} failed (rc {out.returncode}): {out.stderr.strip()}")
    entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise StackError(f"job user {name!r} has uid 0: that is root under another name")
    return entry


def open_to_jobs(layout: Layout) -> None:
    """Set the state dir's modes for jobs (module docstring) and, with a job user, create it and give it
    the run root. Idempotent; called before any component starts."""
    state = layout.state_dir
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o711)
    for name in PRIVATE_DIRS:
        private = layout.dir(name)
        private.mkdir(exist_ok=True)
        private.chmod(0o700)
    if layout.job_user is None:
        return
    entry = ensure_user(layout.job_user)
    root = layout.run_root
    root.mkdir(exist_ok=True)
    os.chown(root, entry.pw_uid, entry.pw_gid)
    root.chmod(0o700)


def check_job_user_runs(layout: Layout, python: str = sys.executable) -> None:
    """Raise StackError, saying what to change, unless the job user can run `python` (the interpreter
    jobs get: Airflow's own) with longrun's job side and find Slurm's config. A directory above the
    interpreter that others may not search (a home dir of mode 0700) is the usual cause."""
    if layout.job_user is None:
        return
    # Checked from the modes first: a probe as the user has passed here while slurmstepd, starting the
    # same interpreter as the same user, was refused ("bad interpreter: Permission denied").
    blocked = _first_unsearchable(Path(python))
    if blocked is not None:
        raise StackError(
            f"jobs run as {layout.job_user!r}, which cannot reach {python} ({blocked} is mode"
            f" {blocked.stat().st_mode & 0o777:04o}, and others may not search it). Give the job user the"
            " interpreter (a virtual environment whose Python and directories others may read and search),"
            " or start the stack with `--job-user none` (jobs then run as the orchestrator's user, which"
            " keeps nothing from them: docs/security.md)"
        )
    entry = pwd.getpwnam(layout.job_user)
    conf = layout.dir("slurm") / "slurm.conf"
    as_user = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--"]
    probe = f"import os, training; assert os.access({str(conf)!r}, os.R_OK), 'cannot read {conf}'"
    out = subprocess.run(
        [*as_user, python, "-c", probe],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": NO_HOME},
        cwd="/",
    )
    if out.returncode == 0:
        return
    blocked = _first_unsearchable(Path(python))
    why = f"{blocked} is mode {blocked.stat().st_mode & 0o777:04o}" if blocked else out.stderr.strip()[-400:]
    raise StackError(
        f"jobs run as {layout.job_user!r}, which cannot run {python} ({why}). Give the job user the"
        " interpreter (a virtual environment whose Python and directories others may read and search),"
        " or start the stack with `--job-user none` (jobs then run as the orchestrator's user, which"
        " keeps nothing from them: docs/security.md)"
    )


def _first_unsearchable(path: Path) -> Path | None:
    """The first directory that others may not search on the way to `path`, if any: above `path` as
    written, above each link it goes through, and above where it resolves to. Each hop counts, since
    exec walks every one: a virtualenv's Python is a link to its base interpreter, so both the venv's
    directories (a link in a private dir to a public interpreter) and the base's (pyenv's, under a 0700
    home) must be searchable."""
    hops = [Path(os.path.abspath(path))]
    while hops[-1].is_symlink() and len(hops) <= MAX_LINK_HOPS:
        hops.append(Path(os.path.abspath(hops[-1].parent / hops[-1].readlink())))
    hops.append(path.resolve())
    for hop in hops:
        for parent in reversed(hop.parents):
            if not parent.stat().st_mode & 0o001:
                return parent
    return None
