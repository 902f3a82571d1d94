"""The e2e/chaos clean-up helper ends what longrun left on the cluster and nothing else."""

from __future__ import annotations

import pytest
from helpers.cleanup import restore_cluster
from longrun.slurm import ops
from longrun.slurm.models import JobStatus

pytestmark = pytest.mark.slurm


def test_restore_cluster_cancels_ours_resumes_ours_and_leaves_the_rest(guard):
    if guard.client.__class__.__name__ != "CliSlurmClient":
        pytest.skip("one backend is enough for a test helper")
    ours = guard.submit(guard.spec("left-behind", ["sleep 120"], nodelist=("n1",)))
    other = guard.submit(guard.spec("someone-else", ["sleep 120"], nodelist=("n2",), comment="not-ours"))
    ops.wait_status(guard.client, ours, {JobStatus.RUNNING}, timeout_s=30)
    ops.wait_status(guard.client, other, {JobStatus.RUNNING}, timeout_s=30)
    guard.client.drain("n3", "longrun:sdc:cleanup-test:1")
    guard.drain_foreign("n4", "admin: cable check")
    said: list[str] = []
    restore_cluster(guard.client, say=said.append)
    assert guard.client.job(ours).status is JobStatus.CANCELLED, said
    assert guard.client.job(other).status is JobStatus.RUNNING, "a job without longrun's tag was cancelled"
    assert not guard.client.node("n3").drain_flag
    assert guard.client.node("n4").drain_flag, "a drain by someone else was lifted"
