"""The SlurmClient contract, run against every backend present (pyslurm is skipped with its reason).

Against the real four-node cluster of the local stack; nothing here is mocked (the bad-input test only
blocks the way to Slurm, to prove that nothing reached it).
"""

from __future__ import annotations

import time

import pytest
from longrun.slurm import cli_backend, ops
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import (
    ForeignDrainError,
    InvalidSpecError,
    JobNotFoundError,
    SlurmCommandError,
    SlurmError,
    SubmitRejectedError,
)
from longrun.slurm.models import JobStatus, JobStep

pytestmark = pytest.mark.slurm

FINAL = {s for s in JobStatus} - {
    JobStatus.PENDING,
    JobStatus.RUNNING,
    JobStatus.REQUEUED,
    JobStatus.SUSPENDED,
}


def test_conforms_to_the_protocol(guard):
    assert isinstance(guard.client, SlurmClient)
    assert guard.client.version().split(".")[0].isdigit()


def test_completed(guard):
    job = guard.submit(guard.spec("ok", ["echo hello"]))
    state = ops.wait_status(guard.client, job, FINAL, timeout_s=60)
    assert (state.status, state.exit_code, state.restart_count) == (JobStatus.COMPLETED, 0, 0)
    assert len(state.nodes) == 1 and state.comment == "longrun/test/ok/t/-1/1"
    assert "hello" in guard.output(job)


def test_failed_exit_3_keeps_code_and_reason(guard):
    job = guard.submit(guard.spec("fail3", ["exit 3"]))
    state = ops.wait_status(guard.client, job, FINAL, timeout_s=60)
    assert (state.status, state.exit_code, state.reason) == (JobStatus.FAILED, 3, "NonZeroExitCode")


def test_cancelled(guard):
    job = guard.submit(guard.spec("sleeper", ["sleep 120"]))
    ops.wait_status(guard.client, job, {JobStatus.RUNNING}, timeout_s=30)
    guard.client.cancel(job)
    state = ops.wait_status(guard.client, job, FINAL, timeout_s=30)
    assert state.status is JobStatus.CANCELLED
    guard.client.cancel(job)  # idempotent on a finished job


def test_durable_record_agrees_with_the_controller(guard):
    """After MinJobAge slurmctld forgets a job; jobcomp/filetxt then answers with the same final state as
    this backend read live (the pyslurm backend falls back to the same record)."""
    cli = CliSlurmClient(slurm_conf=guard.slurm_conf)
    job = guard.submit(guard.spec("durable", ["exit 3"]))
    live = ops.wait_status(guard.client, job, FINAL, timeout_s=60)
    ops.wait_for(cli, job, lambda _s: cli._from_jobcomp(job) is not None, timeout_s=10)
    durable = cli._from_jobcomp(job)
    assert durable is not None and durable.source == "jobcomp"
    assert (durable.status, durable.exit_code, durable.nodes) == (live.status, live.exit_code, live.nodes)


def test_unknown_job(guard):
    with pytest.raises(JobNotFoundError):
        guard.client.job(99_999_999)


def test_find_by_tag_newest_first(guard):
    # One tag per backend: the other backend's run of this test left its jobs in slurmctld (MinJobAge).
    tag = f"longrun/test/findme-{guard.client.backend}/t/-1/"
    a = guard.submit(guard.spec("tagged", ["sleep 30"], comment=f"{tag}1"))
    b = guard.submit(guard.spec("tagged", ["sleep 30"], comment=f"{tag}2"))
    guard.submit(guard.spec("other", ["sleep 30"], comment="longrun/test/other/t/-1/1"))
    found = guard.client.find_jobs(tag)
    assert [s.job_id for s in found] == [b, a]


def test_submit_rejected_for_unknown_partition(guard):
    with pytest.raises(SubmitRejectedError, match="partition"):
        guard.submit(guard.spec("nopart", ["true"], partition="nosuchpart"))


def test_drain_needs_our_prefix_and_resume_refuses_foreign(guard, slurm_cluster):
    with pytest.raises(InvalidSpecError, match="longrun:"):
        guard.client.drain("n4", "maintenance")
    guard.client.drain("n4", "longrun:test:drain")
    n4 = guard.client.node("n4")
    assert n4.drain_flag and n4.is_ours and n4.reason == "longrun:test:drain"
    guard.client.resume("n4")
    assert not guard.client.node("n4").drain_flag
    guard.client.resume("n4")  # not drained: nothing to do

    guard.drain_foreign("n3", "admin: bad DIMM")
    with pytest.raises(ForeignDrainError, match="admin: bad DIMM"):
        guard.client.resume("n3")
    assert guard.client.node("n3").drain_flag  # untouched


def test_node_states_list_all_nodes(guard, slurm_cluster):
    states = {s.name: s for s in guard.client.nodes()}
    assert sorted(states) == sorted(slurm_cluster.nodes)
    assert all(s.state in ("idle", "mixed", "allocated") for s in states.values())


def test_maint_reservation_create_delete(guard):
    name = guard.client.create_maint_reservation("longrun_test_resv", ("n4",), duration_min=5)
    assert name in guard.client.reservations()
    guard.client.delete_reservation(name)
    assert name not in guard.client.reservations()


def test_a_diagnostic_srun_gives_up_on_an_allocation_that_does_not_come(guard, monkeypatch):
    """A diagnostic's srun whose allocation never comes (in the fault matrix: slurmctld killed before it
    saved the pending allocation) gave up only at its own timeout, the verdict 10 minutes late. It now
    gives up on the allocation after SRUN_ALLOCATION_WAIT_S. Here the node is busy under a reservation
    that ignores its job, so the allocation waits; the wait is cut short to keep the test quick."""
    monkeypatch.setattr(cli_backend, "SRUN_ALLOCATION_WAIT_S", 3)
    busy = guard.submit(guard.spec("busy", ["sleep 120"], nodelist=("n4",), ntasks_per_node=2))
    ops.wait_status(guard.client, busy, {JobStatus.RUNNING}, timeout_s=60)
    guard.scontrol(
        "create", "reservation", "ReservationName=longrun_test_busy", "Nodes=n4", "StartTime=now",
        "Duration=10", "Users=root", "Flags=maint,ignore_jobs",
    )  # fmt: skip
    result = guard.client.run_in_reservation("longrun_test_busy", "n4", ("true",), timeout_s=600)
    assert result.exit_code not in (0, 124), result  # 124: our own timeout, the old behaviour
    assert "Unable to allocate resources" in result.stderr, result.stderr
    assert not [j for j in guard.client.jobs() if j.name == "longrun-diag" and j.is_active]


def _observed(s):
    return (s.status, s.slurm_state, s.exit_code, s.signal, s.reason, s.nodes, s.restart_count, s.held)


def test_same_states_as_the_cli_on_the_same_jobs(guard):
    """Exit codes, signals, reasons, nodes, holds: this backend reads every job as the CLI backend does."""
    cli = CliSlurmClient(slurm_conf=guard.slurm_conf)
    tag = f"longrun/test/same-{guard.client.backend}/t/-1/"
    ok = guard.submit(guard.spec("same", ["true"], comment=f"{tag}1"))
    failed = guard.submit(guard.spec("same", ["exit 3"], comment=f"{tag}2"))
    killed = guard.submit(guard.spec("same", ["kill -9 $$"], comment=f"{tag}3"))
    cancelled = guard.submit(guard.spec("same", ["sleep 120"], comment=f"{tag}4"))
    held = guard.submit(guard.spec("same", ["sleep 120"], comment=f"{tag}5"))
    for job in (cancelled, held):
        ops.wait_status(guard.client, job, {JobStatus.RUNNING}, timeout_s=30)
    guard.client.cancel(cancelled)
    guard.client.requeue_hold(held)
    for job in (ok, failed, killed, cancelled):
        ops.wait_status(guard.client, job, FINAL, timeout_s=60)
    ops.wait_for(guard.client, held, lambda s: s.held, timeout_s=30)
    for job in (ok, failed, killed, cancelled, held):
        assert _observed(guard.client.job(job)) == _observed(cli.job(job)), job
    # The listing compares without the reason: the CLI lists through squeue's JSON, whose reason is the
    # short code (`JobHeldUser`) where scontrol, and pyslurm, give the description.
    mine = {s.job_id: _observed(s)[:4] + _observed(s)[5:] for s in guard.client.find_jobs(tag)}
    theirs = {s.job_id: _observed(s)[:4] + _observed(s)[5:] for s in cli.find_jobs(tag)}
    assert mine == theirs and list(mine) == [held, cancelled, killed, failed, ok]
    assert guard.client.job(killed).signal == 9 and guard.client.job(killed).exit_code is None
    assert guard.client.job(failed).exit_code == 3
    assert guard.client.job(held).status is JobStatus.REQUEUED


# -- inside a running job: steps, batch host, shrinking, a step on one of its nodes --------------------


def _steps_named(client, job: int, name: str, timeout_s: float = 60) -> list[JobStep]:
    deadline = time.monotonic() + timeout_s
    while True:
        steps = client.job_steps(job)
        if any(s.name == name for s in steps) or time.monotonic() > deadline:
            return steps
        time.sleep(0.3)


def test_steps_and_batch_host_of_a_running_job(guard):
    """The steps a job runs (Slurm's own and an srun step of its script) and the node of its batch
    script, read as the CLI reads them (squeue --steps, scontrol show job)."""
    cli = CliSlurmClient(slurm_conf=guard.slurm_conf)
    job = guard.submit(guard.spec("steps", ["srun --job-name=contract-step sleep 120"], nodes=2))
    held = ops.wait_status(guard.client, job, {JobStatus.RUNNING}, timeout_s=60).nodes
    steps = _steps_named(guard.client, job, "contract-step")
    assert all(isinstance(s, JobStep) and s.step_id.startswith(f"{job}.") for s in steps), steps
    (step,) = [s for s in steps if s.name == "contract-step"]
    step_id, name = step  # unpacks as the (step id, name) pair callers read
    assert (step_id, name) == (f"{job}.0", "contract-step")
    assert sorted(steps) == sorted(cli.job_steps(job))
    host = guard.client.batch_host(job)
    assert host in held and host == cli.batch_host(job)


def test_a_pending_job_has_no_batch_host_and_no_steps(guard):
    busy = guard.submit(guard.spec("busy", ["sleep 120"], nodelist=("n4",), ntasks_per_node=2))
    ops.wait_status(guard.client, busy, {JobStatus.RUNNING}, timeout_s=60)
    waiting = guard.submit(guard.spec("waiting", ["true"], nodelist=("n4",), ntasks_per_node=2))
    ops.wait_status(guard.client, waiting, {JobStatus.PENDING}, timeout_s=30)
    assert guard.client.batch_host(waiting) is None
    assert guard.client.job_steps(waiting) == []


def test_an_unknown_job_has_no_batch_host_and_no_steps(guard):
    assert guard.client.batch_host(99_999_999) is None
    assert guard.client.job_steps(99_999_999) == []


def test_steps_and_batch_host_are_an_error_when_slurm_cannot_answer(tmp_path):
    """Not "no steps": a caller waiting for a step to end must not read a failed look as "ended". (The
    pyslurm backend lists steps through its CLI client; libslurm keeps one config per process.)"""
    broken = tmp_path / "broken-slurm.conf"
    broken.write_text("this is not a slurm.conf\n")
    client = CliSlurmClient(slurm_conf=str(broken))
    with pytest.raises(SlurmError):
        client.job_steps(1)
    with pytest.raises(SlurmError):
        client.batch_host(1)


def test_shrink_releases_a_node_from_a_running_job_and_keeps_the_batch_host(guard):
    job = guard.submit(guard.spec("shrink", ["sleep 120"], nodes=2))
    held = ops.wait_status(guard.client, job, {JobStatus.RUNNING}, timeout_s=60).nodes
    host = guard.client.batch_host(job)
    assert host is not None and len(held) == 2
    guard.client.shrink_job(job, (host,))
    state = ops.wait_for(guard.client, job, lambda s: s.nodes == (host,), timeout_s=30)
    assert state.status is JobStatus.RUNNING  # the batch script runs on
    assert guard.client.batch_host(job) == host


def test_shrinking_a_job_slurm_does_not_know_is_refused(guard):
    with pytest.raises(SlurmCommandError):
        guard.client.shrink_job(99_999_999, ("n1",))


def test_a_step_inside_a_running_job(guard):
    job = guard.submit(guard.spec("host", ["sleep 120"], nodes=2))
    held = ops.wait_status(guard.client, job, {JobStatus.RUNNING}, timeout_s=60).nodes
    result = guard.client.run_in_job(
        job, held[1], ("printenv", "SLURM_JOB_ID", "SLURMD_NODENAME"), timeout_s=60, overlap=True
    )
    assert (result.exit_code, result.stdout.split()) == (0, [str(job), held[1]]), result


class _Unreachable:
    """Stands in for the way to Slurm: any use of it fails the test."""

    calls: list[str] = []

    def __init__(self, what: str) -> None:
        self.what = what

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        _Unreachable.calls.append(f"{self.what}.{name}")
        raise AssertionError(f"{self.what}.{name} reached Slurm")

    def __call__(self, *args, **kw):
        _Unreachable.calls.append(f"{self.what}({args})")
        raise AssertionError(f"{self.what} reached Slurm: {args}")


BAD_JOB_IDS = ["1", "1;id", 1.0, True, 0, -1, 2**40, None]
# Each would reach scontrol's NodeList= as something else than a list of plain nodes: two nodes in one
# name, a second argument or a shell command (were there a shell), every node, an option, a hostlist.
BAD_NODES = [("n1,n2",), ("n1 n2",), ("n1;reboot",), ("ALL",), ("-n1",), ("n[1-2]",), ("n1\n",), ("n1", "n1")]
BAD_ARGV = [(), ("--uid=0", "id"), ("a\0b",), "id"]


def test_bad_input_is_refused_before_slurm_is_asked(guard, monkeypatch):
    """The attack: a job id or node name from an alert or a record carries a second value, a keyword or
    an option. Every in-job call refuses it before any command runs (or any pyslurm call is made)."""
    _Unreachable.calls = []
    monkeypatch.setattr(CliSlurmClient, "_run", _Unreachable("CliSlurmClient._run"))
    monkeypatch.setattr(cli_backend, "run_srun", _Unreachable("srun"))
    if guard.client.backend == "pyslurm":
        monkeypatch.setattr(guard.client, "_ps", _Unreachable("pyslurm"))
    c = guard.client
    for job in BAD_JOB_IDS:
        with pytest.raises(InvalidSpecError, match="job_id"):
            c.job_steps(job)
        with pytest.raises(InvalidSpecError, match="job_id"):
            c.batch_host(job)
        with pytest.raises(InvalidSpecError, match="job_id"):
            c.shrink_job(job, ("n1",))
        with pytest.raises(InvalidSpecError, match="job_id"):
            c.run_in_job(job, "n1", ("true",), timeout_s=10)
    for nodes in [*BAD_NODES, "n1", ()]:
        with pytest.raises(InvalidSpecError, match="nodes"):
            c.shrink_job(1, nodes)
    for (node,) in BAD_NODES[:-1]:
        with pytest.raises(InvalidSpecError, match="node"):
            c.run_in_job(1, node, ("true",), timeout_s=10)
    for argv in BAD_ARGV:
        with pytest.raises(InvalidSpecError, match="argv"):
            c.run_in_job(1, "n1", argv, timeout_s=10)
    assert _Unreachable.calls == []
