"""Two identities (issue 28, item 1): jobs run as an unprivileged job user, the orchestrator as Slurm's
operator (root on the local stack), on the session's real Slurm cluster.

Each attack is a batch job submitted with `JobSpec.run_as` (sbatch started as that user,
longrun.slurm.job_user) whose script tries what only the orchestrator may do and prints what Slurm
answered: drain a node, resume a node longrun drained, delete longrun's MAINT reservation, cancel another
job user's job, step into that job (`srun --jobid=... --overlap`) to read its environment, and read the
stack's secret files. Each is refused, and the cluster is as before; the orchestrator itself still drains,
resumes, deletes and cancels the same things. Before the change every job ran as the orchestrator's user
(root): each of these attacks succeeded (checked by submitting the same jobs without `run_as`).
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from longrun import runroot
from longrun.monitor import lifecycle
from longrun.runspec import RunSpec
from longrun.slurm import ops
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.errors import InvalidSpecError
from longrun.slurm.models import JobState, JobStatus
from longrun.slurm.spec import JobSpec, JobTag
from longrun.stack.airflow import Airflow
from longrun.stack.job_access import JOB_USER_ENV, check_job_user_runs, ensure_user, open_to_jobs
from longrun.stack.layout import DEFAULT_JOB_USER, NO_JOB_USER, Layout
from longrun.stack.procs import StackError

pytestmark = [pytest.mark.slurm]

OTHER_JOB_USER = "longrun-job-b"
"""A second job user: another owner's runs (one shared job user cannot keep runs apart)."""
JOB_TIMEOUT_S = 120.0
REFUSED = ("Access/permission denied", "Invalid user id", "permission denied")
"""How Slurm 22.05 and 25.11 word a refusal on the caller's rights."""
#: What a job may read under the stack's state dir: Slurm's config and prolog, the cluster's name and the
#: nodes' hardware topology, the daemons' stdout, PID and PID-record files, the finished-jobs record (what
#: `squeue` shows anyway), the layout and the fixtures' log. Everything else (keys, credentials, the
#: store's data, Airflow's files, the controller's saved jobs, the daemons' logs) is the stack's.
JOB_READABLE = (
    "slurm.conf",
    "prolog.sh",
    "clustername",
    "hwloc_topo_whole.xml",
    "jobcomp.txt",
    "pids.json",
    "stack.json",
    "fixtures.log",
)
JOB_READABLE_SUFFIXES = (".out", ".pid")


@pytest.fixture(scope="module")
def job_users() -> tuple[str, str]:
    """The stack's job user and a second one, created when missing (as `longrun stack up` does)."""
    for name in (DEFAULT_JOB_USER, OTHER_JOB_USER):
        ensure_user(name)
    return DEFAULT_JOB_USER, OTHER_JOB_USER


@pytest.fixture
def client(slurm_cluster) -> CliSlurmClient:
    """The orchestrator's client: root, Slurm's SlurmUser on the local stack."""
    return CliSlurmClient(slurm_conf=slurm_cluster.env["SLURM_CONF"])


@pytest.fixture
def scratch(job_users) -> Iterator[dict[str, Path]]:
    """A directory per job user that only it may write (its jobs' scripts run and log there)."""
    made = {}
    for user in job_users:
        path = Path(tempfile.mkdtemp(prefix="lr-job-"))
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
        path.chmod(0o700)
        made[user] = path
    yield made
    for path in made.values():
        shutil.rmtree(path, ignore_errors=True)


def _spec(user: str | None, workdir: Path, lines: list[str], **kw: object) -> JobSpec:
    fields: dict = {
        "name": f"ident-{uuid.uuid4().hex[:6]}",
        "partition": "debug",
        "command": ("set -u", *lines),
        "comment": JobTag(dag_id="test_job_identity", run_id=uuid.uuid4().hex[:8], task_id="attack").render(),
        "gpus_per_node": 0,
        "exclusive": False,
        "time_limit_min": 5,
        "requeue": False,
        "workdir": str(workdir),
        "output": f"{workdir}/%j.out",
        "run_as": user,
        **kw,
    }
    return JobSpec(**fields)


def _finished(client: CliSlurmClient, job_id: int) -> JobState:
    return ops.wait_for(client, job_id, lambda s: s.is_terminal, timeout_s=JOB_TIMEOUT_S)


def _running(client: CliSlurmClient, job_id: int) -> JobState:
    return ops.wait_for(
        client, job_id, lambda s: s.status is JobStatus.RUNNING or s.is_terminal, timeout_s=JOB_TIMEOUT_S
    )


def _attack(client: CliSlurmClient, user: str, workdir: Path, lines: list[str], **kw: object) -> str:
    """Run `lines` as a job of `user`, wait for its end, and return what it printed."""
    job_id = client.submit(_spec(user, workdir, lines, **kw))
    state = _finished(client, job_id)
    out = (workdir / f"{job_id}.out").read_text()
    assert state.status is JobStatus.COMPLETED, f"{state.describe()}: {out}"
    return out


def _refused(out: str) -> bool:
    return any(word.lower() in out.lower() for word in REFUSED)


def _squeue_user(env: dict[str, str], job_id: int) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-j", str(job_id), "-o", "%u"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip()


# -- the job user's job works -----------------------------------------------------------------------


def test_a_job_runs_as_its_job_user_and_the_orchestrator_still_cancels_it(
    client, slurm_cluster, job_users, scratch
) -> None:
    """Slurm runs the job as the job user, with the job user's login names and the secret handed to it
    by name; it can use Slurm's read commands (the launch script needs them) and write its own dir; and
    the orchestrator cancels it."""
    user = job_users[0]
    lines = [
        'echo "whoami=$(id -un) USER=$USER HOME=$HOME"',
        'echo "secret=${LONGRUN_ALERT_KEY:-missing}"',
        'echo "first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "mkdir -p run && echo written > run/record && echo wrote=$?",
        "sleep 300",
    ]
    job_id = client.submit(_spec(user, scratch[user], lines), secret_env={"LONGRUN_ALERT_KEY": "k3y"})
    try:
        assert _running(client, job_id).status is JobStatus.RUNNING
        assert _squeue_user(slurm_cluster.env, job_id) == user
        out = scratch[user] / f"{job_id}.out"
        ops.wait_for(
            client, job_id, lambda _s: "wrote=" in (out.read_text() if out.exists() else ""), timeout_s=60
        )
        text = out.read_text()
        assert f"whoami={user} USER={user} HOME=/nonexistent" in text
        assert "secret=k3y" in text
        assert "first=n" in text
        assert "wrote=0" in text
        assert (scratch[user] / "run" / "record").stat().st_uid == pwd.getpwnam(user).pw_uid
    finally:
        client.cancel(job_id)
    assert _finished(client, job_id).status is JobStatus.CANCELLED


def test_the_orchestrator_runs_a_diagnostic_step_inside_a_job_users_job(client, job_users, scratch) -> None:
    """The hot-spare path probes inside the kept job (`run_in_job`, `srun --jobid --overlap`). Slurm
    creates a step only for the job's own user (root too is refused), so the orchestrator starts that srun
    as the job's owner: the step runs, as that user, and nothing else of the orchestrator's runs so."""
    user = job_users[0]
    job_id = client.submit(_spec(user, scratch[user], ["sleep 300"], nodelist=("n2",)))
    try:
        assert _running(client, job_id).status is JobStatus.RUNNING
        result = client.run_in_job(job_id, "n2", ("id", "-un"), timeout_s=60, overlap=True)
        assert result.exit_code == 0, result
        assert result.stdout.strip() == user
    finally:
        client.cancel(job_id)
    _finished(client, job_id)


# -- what a job may not do --------------------------------------------------------------------------


def test_a_job_cannot_drain_a_node_and_the_orchestrator_can(client, job_users, scratch) -> None:
    user = job_users[0]
    out = _attack(
        client,
        user,
        scratch[user],
        ["scontrol update NodeName=n4 State=DRAIN Reason=x 2>&1; echo rc=$?"],
        exclude=("n4",),
    )
    assert "rc=0" not in out and _refused(out), out
    assert not client.node("n4").drain_flag
    client.drain("n4", "longrun: test_job_identity")
    try:
        assert client.node("n4").drain_flag
    finally:
        client.resume("n4")


def test_a_job_cannot_resume_a_node_longrun_drained_and_the_orchestrator_can(
    client, job_users, scratch
) -> None:
    user = job_users[0]
    client.drain("n4", "longrun: test_job_identity")
    try:
        out = _attack(
            client, user, scratch[user], ["scontrol update NodeName=n4 State=RESUME 2>&1; echo rc=$?"]
        )
        assert "rc=0" not in out and _refused(out), out
        assert client.node("n4").drain_flag
    finally:
        client.resume("n4")
    assert not client.node("n4").drain_flag


def test_a_job_cannot_delete_a_maint_reservation_and_the_orchestrator_can(client, job_users, scratch) -> None:
    user = job_users[0]
    name = f"longrun_diag_{uuid.uuid4().hex[:8]}_n4"
    client.create_maint_reservation(name, ("n4",), 10)
    try:
        out = _attack(
            client,
            user,
            scratch[user],
            [
                f"scontrol delete ReservationName={name} 2>&1; echo rc=$?",
                f"scontrol update ReservationName={name} Users={user} 2>&1; echo rc=$?",
            ],
            exclude=("n4",),
        )
        assert "rc=0" not in out and _refused(out), out
        assert name in client.reservations()
    finally:
        client.delete_reservation(name)
    assert name not in client.reservations()


def test_a_job_cannot_cancel_another_users_job_and_the_orchestrator_can(
    client, slurm_cluster, job_users, scratch
) -> None:
    """Two job users (two owners' runs): one's job cannot cancel the other's; the orchestrator can."""
    user, other = job_users
    victim = client.submit(_spec(other, scratch[other], ["sleep 300"]))
    try:
        assert _running(client, victim).status is JobStatus.RUNNING
        out = _attack(
            client,
            user,
            scratch[user],
            [f"scancel {victim} 2>&1; echo rc=$?", f"scontrol requeuehold {victim} 2>&1; echo rc=$?"],
        )
        assert "rc=0" not in out and _refused(out), out
        assert client.job(victim).status is JobStatus.RUNNING
        assert _squeue_user(slurm_cluster.env, victim) == other
    finally:
        client.cancel(victim)
    assert _finished(client, victim).status is JobStatus.CANCELLED


def test_a_job_cannot_step_into_another_users_job_to_read_its_environment(client, job_users, scratch) -> None:
    """`srun --jobid=<victim> --overlap` would run a step in the victim's job, as whoever may: with the
    victim's processes' environment (its alert key) one `cat /proc/*/environ` away. Refused; and the
    victim's processes' environment is not readable from outside its user either."""
    user, other = job_users
    marker = f"alert-key-{uuid.uuid4().hex}"
    victim = client.submit(
        _spec(other, scratch[other], ["sleep 300"], nodelist=("n3",)),
        secret_env={"LONGRUN_ALERT_KEY": marker},
    )
    grep_env = f"cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c {marker}"
    try:
        assert _running(client, victim).status is JobStatus.RUNNING
        out = _attack(
            client,
            user,
            scratch[user],
            [
                f"srun --jobid={victim} --overlap --ntasks=1 --nodes=1 bash -c {shlex.quote(grep_env)} 2>&1",
                "echo rc=$?",
                f'echo "direct=$({grep_env})"',
            ],
            nodelist=("n3",),
        )
        assert _refused(out), out
        assert "direct=0" in out, out
        assert client.job(victim).status is JobStatus.RUNNING
    finally:
        client.cancel(victim)
    _finished(client, victim)


def test_a_job_cannot_read_the_stacks_secrets(
    client, slurm_cluster, s3_store_env, job_users, scratch
) -> None:
    """Every file under the state dir (but the run root, the jobs' own) is tried by a job of the job user:
    it reads only Slurm's config and prolog and the daemons' harmless files (JOB_READABLE), never the
    munge key, the store's credentials, keys or data (the alert keys are in there), Airflow's secrets or
    database, or the controller's saved jobs (their scripts and environments)."""
    user = job_users[0]
    state = slurm_cluster.stack.state_dir
    every = sorted(str(p) for p in state.rglob("*") if p.is_file() and not p.is_relative_to(state / "runs"))
    secret = [p for p in every if not _job_may_read(Path(p))]
    assert any(p.endswith("munge.key") for p in secret) and any("/s3/" in p for p in secret), secret
    listing = scratch[user] / "files.txt"
    listing.write_text("\n".join(every) + "\n")
    out = _attack(
        client,
        user,
        scratch[user],
        [
            f'while read -r f; do head -c 1 "$f" >/dev/null 2>&1 && echo "READ $f"; done < {listing}; echo done'
        ],
    )
    assert "done" in out, out
    read = {line.removeprefix("READ ") for line in out.splitlines() if line.startswith("READ ")}
    assert "slurm.conf" in " ".join(read), out  # the job did run its reads
    assert not read & set(secret), "\n".join(sorted(read & set(secret)))
    for private in ("s3", "airflow"):
        assert (state / private).stat().st_mode & 0o777 == 0o700


def _job_may_read(path: Path) -> bool:
    return path.name in JOB_READABLE or path.suffix in JOB_READABLE_SUFFIXES


# -- where the orchestrator decides the job user ---------------------------------------------------


def test_the_job_user_setting_is_validated(monkeypatch) -> None:
    for bad in ("root", "a b", "x;id", "-rf", "Admin", "a" * 40):
        with pytest.raises(InvalidSpecError):
            runroot.job_user({JOB_USER_ENV: bad})
    assert runroot.job_user({}) is None
    assert runroot.job_user({JOB_USER_ENV: ""}) is None
    with pytest.raises(InvalidSpecError, match="root"):
        _spec("root", Path("/tmp"), ["true"])


def test_a_run_submits_as_the_job_user_and_its_default_root_is_the_job_users(
    monkeypatch, tmp_path, job_users
) -> None:
    """LONGRUN_JOB_USER makes every launch's JobSpec (training_run's and the relaunch's: both
    `lifecycle.make_job`) run as that user, and the run root, the default one or a missing one the site
    names, is made the job user's, 0700."""
    user = job_users[0]
    monkeypatch.setenv(JOB_USER_ENV, user)
    monkeypatch.delenv("LONGRUN_RUN_ROOT", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    spec = RunSpec.from_params({"run_name": "ident-run", "nodes": 1, "gpus_per_node": 0})
    job = lifecycle.make_job(spec, JobTag(dag_id="training_run", run_id="r1", task_id="submit"))
    assert job.run_as == user
    root = tmp_path / runroot.DEFAULT_NAME
    assert job.workdir == str(root)
    st = root.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (pwd.getpwnam(user).pw_uid, 0o700)
    named = tmp_path / "site" / "runs"  # a root the site names, not there yet: made the job user's
    monkeypatch.setenv("LONGRUN_RUN_ROOT", str(named))
    assert (
        lifecycle.make_job(spec, JobTag(dag_id="training_run", run_id="r1", task_id="submit")).run_as == user
    )
    st = named.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (pwd.getpwnam(user).pw_uid, 0o700)
    monkeypatch.delenv(JOB_USER_ENV)
    monkeypatch.setenv("LONGRUN_RUN_ROOT", str(tmp_path / "explicit"))
    assert (
        lifecycle.make_job(spec, JobTag(dag_id="training_run", run_id="r1", task_id="submit")).run_as is None
    )


def test_an_unknown_job_user_is_refused_before_slurm(client, tmp_path) -> None:
    with pytest.raises(InvalidSpecError, match="no such Unix user"):
        client.submit(_spec("longrun-no-such-user", tmp_path, ["true"]))


# -- the local stack -------------------------------------------------------------------------------


def test_the_stack_makes_its_job_user_and_hands_it_only_the_run_root(tmp_path, job_users) -> None:
    """`longrun stack up`'s preparation: the state dir searchable only, the secret component dirs private,
    the run root the job user's; Airflow's workers submit as the job user; a stack without one (the test
    session's default) leaves them submitting as themselves."""
    user = job_users[0]
    layout = Layout(state_dir=tmp_path / "state", job_user=user)
    open_to_jobs(layout)
    assert layout.state_dir.stat().st_mode & 0o777 == 0o711
    for private in ("s3", "airflow"):
        assert layout.dir(private).stat().st_mode & 0o777 == 0o700
    root = layout.run_root.stat()
    assert (root.st_uid, root.st_mode & 0o777) == (pwd.getpwnam(user).pw_uid, 0o700)
    assert Airflow(layout).daemon_env()[JOB_USER_ENV] == user
    assert Layout.load(layout.state_dir).job_user is None  # nothing saved: a Stack made in code has none
    assert Layout.load(layout.state_dir, default_job_user=user).job_user == user  # `longrun stack up`
    layout.save()
    assert Layout.load(layout.state_dir).job_user == user
    assert Layout.load(layout.state_dir, job_user=NO_JOB_USER).job_user is None
    without = Layout(state_dir=tmp_path / "plain")
    open_to_jobs(without)
    assert JOB_USER_ENV not in Airflow(without).daemon_env()
    with pytest.raises(ValueError, match="root"):
        Layout(state_dir=tmp_path, job_user="root")


def test_the_stack_stops_when_its_job_user_cannot_run_the_interpreter(tmp_path, job_users) -> None:
    """An interpreter behind a directory others may not search (a home dir of mode 0700, as /root on the
    project's machine) would fail every job: `stack up` says so, and how to go on."""
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    (hidden / "python").symlink_to(sys.executable)
    layout = Layout(state_dir=tmp_path / "state", job_user=job_users[0])
    with pytest.raises(StackError, match="cannot reach .*--job-user none"):
        check_job_user_runs(layout, python=str(hidden / "python"))


def test_the_default_job_user_falls_back_loudly_and_an_asked_for_one_stops(
    tmp_path, job_users, monkeypatch
) -> None:
    """`longrun stack up` and the demo ask for no job user: where the default one cannot run the interpreter
    (this machine's Python sits under /root, mode 0700) the stack runs jobs as the orchestrator's user and
    says so, instead of failing every job; a job user that was asked for stops the stack instead."""
    from longrun.stack import job_access
    from longrun.stack.stack import Stack

    def unreachable(layout, python=sys.executable):
        if layout.job_user is not None:
            raise StackError(f"jobs run as {layout.job_user!r}, which cannot reach {python}")

    monkeypatch.setattr(job_access, "check_job_user_runs", unreachable)  # longrun's own check, not a library
    monkeypatch.delenv("LONGRUN_STACK_JOB_USER", raising=False)
    said: list[str] = []
    by_default = Stack(tmp_path / "default", default_job_user=job_users[0])
    by_default._job_user_runs(said.append)
    assert by_default.layout.job_user is None and by_default.airflow.layout.job_user is None
    assert "WARNING" in said[0] and "orchestrator's user" in said[0]
    assert Stack(tmp_path / "default").layout.job_user is None  # saved: the next `up` does the same
    asked = Stack(tmp_path / "asked", job_user=job_users[0])
    with pytest.raises(StackError, match="cannot reach"):
        asked._job_user_runs(said.append)
