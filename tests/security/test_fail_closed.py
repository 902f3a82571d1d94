"""Issue 28, item 8: the smaller doors fail closed. Each test is the attack; each failed on the code before
its fix (see docs/security.md, "Fail closed"). No Slurm, no S3: a Slurm job is a `JobState` built by hand,
the store a local directory.

1. the alert key is found only through the key record bound to the job id, never the public `--comment`
2. an incident that may change the cluster (act, approve) is refused on a store with one side
3. an unknown triggering user lets nobody lift the drain rate limit
4. the stack's prolog quotes its path
5. a private file holds its secret only while its mode is 0600
6. the default run root is refused when another user could have made it
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import cast

import pytest
from longrun import alert_auth, security_events
from longrun.incident import approval, modes
from longrun.incident.runner import Incident, IncidentStop, authenticate
from longrun.slurm.client import SlurmClient
from longrun.slurm.models import JobState, JobStatus
from longrun.slurm.spec import JobTag
from longrun.stack.layout import Layout
from longrun.stack.procs import write_private
from longrun.stack.slurm_conf import render_prolog, slurm_paths

from training.records import schema, signing
from training.store.interface import put_json
from training.store.local import LocalDirStore
from training.store.sides import SidedStore

RUN = "r1"
TAG = JobTag(dag_id="training_run", run_id="manual__2026-01-01", task_id="launch").render()

# ---- 1. the alert key and the public tag -----------------------------------------------------------


class _Slurm:
    """What verify_alert asks Slurm: one job."""

    def __init__(self, state: JobState) -> None:
        self.state = state

    def job(self, job_id: int) -> JobState:
        assert job_id == self.state.job_id
        return self.state


def _slurm(state: JobState) -> SlurmClient:
    return cast(SlurmClient, _Slurm(state))


def _job(job_id: int, comment: str = TAG) -> JobState:
    return JobState(
        job_id=job_id,
        status=JobStatus.RUNNING,
        slurm_state="RUNNING",
        name=RUN,
        comment=comment,
        nodes=("n1", "n2"),
    )


def _alert(job_id: int, key: bytes) -> dict:
    alert = schema.record(
        "alert", run=RUN, step=12, check="finite", suspect_ranks=[1], suspect_nodes=["n1"], evidence={},
        job_id=job_id,
    )  # fmt: skip
    return signing.sign(alert, key)


def test_the_public_tag_alone_finds_no_key_and_the_refusal_is_a_security_event(tmp_path) -> None:
    """A job that carries a run's tag (anyone reads it in `scontrol show job`) but was never bound to the
    key by the orchestrator gets no key: the alert is refused (`no_key`) and a security event says so."""
    store = LocalDirStore(tmp_path)
    key = alert_auth.issue(store, run=RUN, tag=TAG)  # issued at submit; the bind to a job id never came
    impostor = _job(5000)  # another job with the same name and the same public comment
    assert alert_auth.job_key(store, impostor, RUN) is None
    verdict = alert_auth.verify_alert(store, _slurm(impostor), run=RUN, job_id=5000, alert=_alert(5000, key))
    assert (verdict.ok, verdict.reason) == (False, "no_key")
    inc = Incident(
        run=RUN, alert_key=f"runs/{RUN}/alerts/a.json", alert=_alert(5000, key), job_id=5000,
        run_params={"run_name": RUN}, dag_run_id="t",
    )  # fmt: skip
    with pytest.raises(IncidentStop, match="no_key"):
        authenticate(store, _slurm(impostor), inc)
    assert [e.reason for e in security_events.events(store, RUN)] == ["no_key"]


def test_the_job_bound_to_its_key_still_verifies(tmp_path) -> None:
    store = LocalDirStore(tmp_path)
    key = alert_auth.issue(store, run=RUN, tag=TAG)
    alert_auth.bind(store, run=RUN, tag=TAG, job_id=4711)
    genuine = _job(4711)
    assert alert_auth.verify_alert(store, _slurm(genuine), run=RUN, job_id=4711, alert=_alert(4711, key)).ok
    forgotten = _job(4711, comment="")  # Slurm forgot the comment: the binding still names the run
    assert alert_auth.verify_alert(store, _slurm(forgotten), run=RUN, job_id=4711, alert=_alert(4711, key)).ok
    # another job with the genuine job's tag finds nothing through it
    assert alert_auth.job_key(store, _job(5000), RUN) is None


# ---- 2. act without the second store side ----------------------------------------------------------


def test_a_mode_that_changes_the_cluster_is_refused_on_a_one_sided_store(tmp_path) -> None:
    one_sided = LocalDirStore(tmp_path / "one")
    for mode in (modes.ACT, modes.APPROVE):
        with pytest.raises(modes.UnsafeModeError, match="LONGRUN_ORCH_BUCKET"):
            modes.require_boundary(modes.plan(mode), one_sided)
    same_dir = SidedStore(job=LocalDirStore(tmp_path / "one"), orchestrator=LocalDirStore(tmp_path / "one"))
    with pytest.raises(modes.UnsafeModeError):
        modes.require_boundary(modes.plan(modes.ACT), same_dir)
    # observe changes nothing; two sides are the configuration act needs
    modes.require_boundary(modes.plan(modes.OBSERVE), one_sided)
    two = SidedStore(job=LocalDirStore(tmp_path / "j"), orchestrator=LocalDirStore(tmp_path / "o"))
    for mode in (modes.ACT, modes.APPROVE, modes.OBSERVE):
        modes.require_boundary(modes.plan(mode), two)


def test_every_incident_task_refuses_act_on_a_one_sided_store(tmp_path) -> None:
    """Through the task layer (`incident_from`, which every sdc_incident task calls): non-retryable."""
    pytest.importorskip("airflow")
    from airflow.sdk.exceptions import AirflowFailException
    from longrun.monitor import launches
    from longrun.tasks import sdc_incident

    alert = _alert(4711, b"k" * 32)
    params = {"run_name": RUN, "alert_key": f"runs/{RUN}/alerts/a.json", "alert": alert, "job_id": 4711}

    def launched(store, mode: str):  # noqa: ANN202 - the store, holding what the mode is read from
        """The alert and the run's launch as the orchestrator recorded it (the mode comes from there)."""
        put_json(store, params["alert_key"], alert)
        alert_auth.issue(store, run=RUN, tag=TAG)
        alert_auth.bind(store, run=RUN, tag=TAG, job_id=4711)
        launches.record_first(store, {"run_name": RUN, "incident_mode": mode}, JobTag.parse(TAG).run_id)
        return store

    one_sided = launched(LocalDirStore(tmp_path / "one"), "act")
    with pytest.raises(AirflowFailException, match="refused, nothing acted on: incident_mode=act"):
        sdc_incident.incident_from({**params, "run_params": {"run_name": RUN}}, "t", one_sided)
    observing = launched(LocalDirStore(tmp_path / "one-observe"), "observe")
    assert sdc_incident.incident_from(params, "t", observing).mode == "observe"
    two = launched(
        SidedStore(job=LocalDirStore(tmp_path / "j"), orchestrator=LocalDirStore(tmp_path / "o")), "act"
    )
    assert sdc_incident.incident_from({**params, "run_params": {"run_name": RUN}}, "t", two).mode == "act"


# ---- 3. the self-approval check with an unknown triggering user ------------------------------------


@pytest.mark.parametrize("triggered_by", [None, "", "  "])
def test_an_unknown_triggering_user_lets_nobody_lift_the_limit(triggered_by) -> None:
    """Airflow recorded no triggering user: whoever approved may be the one who triggered the run."""
    response = {
        "chosen_options": ["Approve"],
        "params_input": {},
        "responded_by_user": {"id": "olga", "name": "olga"},
    }
    d = approval.decide(response=response, triggered_by=triggered_by, approvers=["olga"])
    assert not d.allowed
    assert "did not record who triggered the run" in d.why


# ---- 4. the prolog's path --------------------------------------------------------------------------


def test_the_prolog_quotes_a_state_dir_with_a_space_and_a_dollar(tmp_path) -> None:
    state = tmp_path / "st ate $(touch pwned)$HOME"
    layout = Layout(state_dir=state)
    marker_dir = slurm_paths(layout)["fail_launch"]
    marker_dir.mkdir(parents=True)
    prolog = tmp_path / "prolog.sh"
    prolog.write_text(render_prolog(layout))

    def launch(node: str) -> int:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "SLURMD_NODENAME": node}
        return subprocess.run(["sh", str(prolog)], cwd=tmp_path, env=env, timeout=30).returncode

    assert launch("n1") == 0
    (marker_dir / "n1").touch()
    assert launch("n1") == 1  # the marker under the literal path fails the launch
    assert launch("n2") == 0
    assert not (tmp_path / "pwned").exists()  # the path's text ran nothing


# ---- 5. a private file is private from its first byte ----------------------------------------------


def test_a_private_file_is_never_readable_through_a_wider_mode(tmp_path, monkeypatch) -> None:
    """The file exists with mode 0644 (an earlier write, or another process's); a reader opened it then.
    Writing the secret must not reach that reader, and the secret is 0600 from its first byte."""
    path = tmp_path / "password.json"
    path.write_text("old\n")
    path.chmod(0o644)
    old_umask = os.umask(0)
    try:
        with open(path) as reader:
            seen_modes: list[int] = []
            real_replace = os.replace

            def replace(src, dst):  # noqa: ANN001, ANN202  (the moment the secret becomes the file)
                assert Path(dst) == path
                seen_modes.append(stat.S_IMODE(os.stat(src).st_mode))
                assert Path(src).read_text() == "secret\n"
                return real_replace(src, dst)

            monkeypatch.setattr(os, "replace", replace)
            write_private(path, "secret\n")
            assert reader.read() == "old\n"  # the reader holds the old file, never the secret
    finally:
        os.umask(old_umask)
    assert seen_modes == [0o600]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "secret\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["password.json"]  # no temp file left


def test_a_private_file_is_not_written_through_a_planted_symlink(tmp_path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    target.chmod(0o644)
    (tmp_path / "secret.json").symlink_to(target)
    write_private(tmp_path / "secret.json", "secret\n")
    assert target.read_text() == ""
    assert not (tmp_path / "secret.json").is_symlink()
    assert stat.S_IMODE((tmp_path / "secret.json").stat().st_mode) == 0o600


# ---- 6. the default run root -----------------------------------------------------------------------


@pytest.fixture
def default_root(tmp_path, monkeypatch) -> Path:
    """The default run root (no LONGRUN_RUN_ROOT), in a temporary directory of this test's."""
    monkeypatch.delenv("LONGRUN_RUN_ROOT", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    return tmp_path / "longrun-runs"


def _run_root() -> str:
    from longrun.monitor import lifecycle

    return lifecycle.run_root()


def test_a_default_run_root_another_user_made_is_refused(default_root) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory another user's needs root")
    default_root.mkdir(mode=0o755)
    os.chown(default_root, 65534 if os.geteuid() != 65534 else 65533, -1)
    with pytest.raises(RuntimeError, match="not owned by .*LONGRUN_RUN_ROOT"):
        _run_root()


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_default_run_root_others_may_write_is_refused(default_root, mode: int) -> None:
    """Sticky or not: others who may write the root may create a run's directory in it before the run."""
    default_root.mkdir()
    default_root.chmod(mode)
    with pytest.raises(RuntimeError, match="writable by others.*LONGRUN_RUN_ROOT"):
        _run_root()


def test_a_default_run_root_that_is_a_symlink_is_refused(default_root, tmp_path) -> None:
    (tmp_path / "theirs").mkdir()
    default_root.symlink_to(tmp_path / "theirs")
    with pytest.raises(RuntimeError, match="symbolic link.*LONGRUN_RUN_ROOT"):
        _run_root()


def test_a_missing_default_run_root_is_made_private_and_an_own_one_is_kept(default_root) -> None:
    old_umask = os.umask(0)
    try:
        assert _run_root() == str(default_root)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(default_root.stat().st_mode) == 0o700
    default_root.chmod(0o755)  # what the code before made (umask 022): still ours, still fine
    assert _run_root() == str(default_root)


def test_an_explicit_run_root_is_the_sites_choice(default_root, tmp_path, monkeypatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # a site's group-writable shared directory, named on purpose
    monkeypatch.setenv("LONGRUN_RUN_ROOT", str(shared))
    assert _run_root() == str(shared)
