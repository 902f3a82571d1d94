"""Session fixtures that bring up the parts of the local stack a test needs, once per session.

- `slurm_cluster`: munge + slurmctld + slurmd n1..n4 (a `SlurmCluster`).
- `slurm_restored` (automatic for every test that uses the session's cluster, outside tests/slurm whose
  `clean_cluster` is stricter): what the test added to the cluster is undone afterwards, even on failure.
- `s3_store_env`: SeaweedFS S3; a dict of AWS_* and LONGRUN_BUCKET.
- `fleet_records_isolated` (automatic for every test that uses the session's S3 store): the fleet-wide
  records (node history, drain ledger) start empty and are restored afterwards (helpers.fleet_records).
- `airflow_stack`: Airflow (after Slurm and S3, so its tasks see both); an `AirflowStack`. Its metadata
  database is SQLite, or PostgreSQL with LONGRUN_TEST_DB=postgres (the stack's own server).
- `drill_reference`: the drills' run (`longrun.drill.DRILL_CONF`) without a fault, launched once per
  session straight on the cluster (helpers.clean_reference): the weights every drill of it must end on.

By default a session runs its own stack in a temporary state dir on a port range of its own, and stops
every component it started at the end, also when tests fail. Its Airflow starts no scheduled runs (the
midnight `checkpoint_audit` closes healthy incidents; a drill across midnight saw its incident closed). With LONGRUN_TEST_REUSE_STACK=1 it uses
the default state dir (that of `longrun stack up`): components already running there are reused and
left running; ones it had to start are stopped at the end. That stack keeps its schedules. The session's
Airflow submits jobs as the job user `longrun-job`, as `longrun stack up` does (docs/security.md, item 14):
when that user cannot run this interpreter (a virtualenv built from a Python under a private home), the
stack falls back to jobs as the orchestrator (root), and the session says so on the terminal.
LONGRUN_TEST_JOB_USER=<name> asks for another job user (the stack then stops if it cannot run the
interpreter), and LONGRUN_TEST_JOB_USER=none for jobs as the orchestrator; tests/security/test_job_identity.py
submits as job users itself.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.clean_reference import CleanRun, launch_clean
from helpers.cluster_state import restore_snapshot, snapshot
from helpers.cpu_profile import register as register_cpu_profile
from helpers.fleet_records import fleet_records_set_aside
from helpers.stack_fixtures import AirflowStack, SlurmCluster, claim_port_base
from helpers.suite_parts import select_part
from longrun.drill import DRILL_CONF
from longrun.stack.layout import DEFAULT_JOB_USER, NO_JOB_USER, default_state_dir
from longrun.stack.procs import StackError
from longrun.stack.stack import Stack


@pytest.fixture(scope="session")
def local_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """The session's Stack object (no component is started by this fixture itself)."""
    if os.environ.get("LONGRUN_TEST_REUSE_STACK") == "1":
        yield Stack(default_state_dir())
        return
    db = os.environ.get("LONGRUN_TEST_DB", "sqlite")
    # Not under pytest's temp root (0700): jobs that run as a job user (and PostgreSQL, which runs as the
    # postgres user when we are root) must reach Slurm's config and munge's socket in the state dir, which
    # the stack makes searchable, not listable (longrun.stack.job_access). Short path: the munge socket
    # path must fit in a Unix socket address (108 bytes). Removed at the end when every test passed and
    # every component stopped; else kept, with its logs.
    state_dir = Path(tempfile.mkdtemp(prefix="lr-st-"))
    state_dir.chmod(0o711)
    # The job user by default, with the stack's own check and fallback (longrun.stack.stack); an explicit
    # LONGRUN_TEST_JOB_USER (a name, or `none`) is used as given.
    job_user = os.environ.get("LONGRUN_TEST_JOB_USER") or None
    base, lock = claim_port_base(state_dir)
    try:
        # No scheduled DAG runs: midnight's checkpoint_audit closed a drill's incident mid-test. The
        # scheduler imports torch once, so the many validation tasks a session runs do not.
        stack = Stack(
            state_dir,
            port_base=base,
            db=db,
            schedules=False,
            preload_torch=True,
            job_user=job_user,
            default_job_user=DEFAULT_JOB_USER,
        )
        yield stack
    finally:
        lock.close()
    if request.session.testsfailed == 0 and not any(c.is_recorded() for c in stack.components.values()):
        shutil.rmtree(state_dir, ignore_errors=True)


def _progress(stack: Stack):  # noqa: ANN202
    """Progress lines go to <state dir>/fixtures.log (pytest captures stdout)."""

    def say(line: str) -> None:
        with open(stack.state_dir / "fixtures.log", "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {line}\n")

    return say


def _bring_up(stack: Stack, component: str, request: pytest.FixtureRequest) -> None:
    """Start `component` unless it runs; stop it at session end only if this session started it."""
    comp = stack.components[component]
    comp.forget_dead()
    if comp.is_recorded() and stack.running(component):
        return
    if not comp.is_recorded():
        # Only what this session started is stopped; a partly running reused stack is only repaired.
        request.addfinalizer(lambda: stack.down([component], say=_progress(stack)))
    try:
        stack.up([component], say=_progress(stack))
    except StackError as exc:
        pytest.fail(f"local stack: {exc}", pytrace=False)


def _warn_if_jobs_run_as_root(stack: Stack, config: pytest.Config) -> None:
    """Say so, on the terminal, when the session's Airflow submits as the orchestrator without being told
    to: the stack fell back (its reason is in <state dir>/fixtures.log), and the session's jobs do not run
    as a job user. A line, not a Python warning: the suite turns warnings into errors, and the tests still
    hold with jobs as root."""
    if stack.layout.job_user is not None or os.environ.get("LONGRUN_TEST_JOB_USER") == NO_JOB_USER:
        return
    line = (
        f"WARNING: the session's jobs run as the orchestrator (root), not as {DEFAULT_JOB_USER!r}: the job"
        f" user cannot run {sys.executable} ({stack.state_dir / 'fixtures.log'} says why; docs/security.md,"
        " item 14). Build .venv from Debian's python3 (make setup), or set LONGRUN_TEST_JOB_USER=none."
    )
    _progress(stack)(line)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # past the session's output capture
            reporter.write_line(line, yellow=True)


@pytest.fixture(scope="session")
def slurm_cluster(local_stack: Stack, request: pytest.FixtureRequest) -> SlurmCluster:
    _bring_up(local_stack, "slurm", request)
    _warn_if_jobs_run_as_root(local_stack, request.config)
    env = local_stack.slurm.env()
    return SlurmCluster(stack=local_stack, env=env, jobcomp_path=local_stack.slurm.paths["jobcomp"])


@pytest.fixture(scope="session")
def s3_store_env(local_stack: Stack, request: pytest.FixtureRequest) -> dict[str, str]:
    _bring_up(local_stack, "s3", request)
    return local_stack.s3.env()


@pytest.fixture(scope="session")
def airflow_stack(
    local_stack: Stack,
    slurm_cluster: SlurmCluster,
    s3_store_env: dict[str, str],
    request: pytest.FixtureRequest,
) -> AirflowStack:
    _bring_up(local_stack, "airflow", request)
    env = local_stack.env()
    return AirflowStack(
        url=env["LONGRUN_AIRFLOW_URL"],
        user=env["LONGRUN_AIRFLOW_USER"],
        password=env["LONGRUN_AIRFLOW_PASSWORD"],
        env=env,
    )


@pytest.fixture(scope="session")
def drill_reference(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> CleanRun:
    """DRILL_CONF's run without a fault, once per session: tests/e2e/test_drill.py and
    tests/nvrx/test_hot_spare.py drill that same run, and each drill must end on these weights."""
    root = tmp_path_factory.mktemp("drill-reference")
    return launch_clean(slurm_cluster.env["SLURM_CONF"], {**DRILL_CONF, "run_name": "drill-reference"}, root)


@pytest.fixture(autouse=True)
def slurm_restored(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that uses the session's cluster leaves it as it found it, also when it fails half-way: the
    jobs it left active are cancelled, its reservations deleted, the nodes it drained or took down resumed,
    a slurmd it killed started again (helpers.cluster_state.restore_snapshot). State that was there before
    the test (a module fixture's job) is left alone."""
    if "slurm_cluster" not in request.fixturenames or "clean_cluster" in request.fixturenames:
        yield
        return
    cluster = request.getfixturevalue("slurm_cluster")
    before = snapshot(cluster)
    yield
    left = restore_snapshot(cluster, before)
    if left:
        pytest.fail(f"the test left the Slurm cluster changed and it could not be restored: {left}")


@pytest.fixture(autouse=True)
def fleet_records_isolated(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test that uses the session's store sees no other test's node history or drains."""
    if "s3_store_env" not in request.fixturenames:
        yield
        return
    from training.store.s3 import S3Store

    request.getfixturevalue("s3_store_env")
    s3 = request.getfixturevalue("local_stack").s3
    client = s3.client()
    stores = [
        S3Store(bucket=b, endpoint_url=s3.layout.s3_endpoint, client=client)
        for b in (s3.layout.bucket, s3.orch_bucket)
    ]
    with fleet_records_set_aside(stores):
        yield


def pytest_configure(config: pytest.Config) -> None:
    """LONGRUN_TEST_CPU=<file>: the busy CPU of each test (helpers.cpu_profile)."""
    register_cpu_profile(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """LONGRUN_SUITE_PART runs one of the suite's two parts (helpers.suite_parts, scripts/test.sh)."""
    select_part(config, items)
