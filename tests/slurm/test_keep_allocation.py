"""What keeping the allocation after an SDC verdict needs from Slurm, checked on the real four-node cluster:
a job step can still run on a node that was drained while the job holds it (diagnosis inside the
allocation, no MAINT reservation), `scontrol update JobId=<id> NodeList=<rest>` shrinks the running job
so the node leaves the allocation and stays drained with longrun's reason, and the job keeps running
steps on the nodes it kept. Every node and job is restored, also on failure."""

from __future__ import annotations

import subprocess
import time

import pytest
from longrun.slurm import ops
from longrun.slurm.factory import make_client
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec

pytestmark = [pytest.mark.slurm]

REASON = "longrun:test:keep-allocation"


@pytest.fixture
def client(slurm_cluster):
    return make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=60)


def test_a_job_diagnoses_then_releases_a_drained_node_and_keeps_running(tmp_path, client, slurm_cluster):
    env = slurm_cluster.client_env()
    spec = JobSpec(
        name="keep-alloc", partition=slurm_cluster.partition, command=("sleep 300",),
        comment="longrun/test/keep/alloc/-1/1", nodes=3, gpus_per_node=0, exclusive=False,
        time_limit_min=5, workdir=str(tmp_path), output="keep-%j.out",
    )  # fmt: skip
    job_id = client.submit(spec)
    suspect = None
    try:
        state = ops.wait_status(client, job_id, {JobStatus.RUNNING}, timeout_s=60)
        assert len(state.nodes) == 3, state.describe()
        keep, suspect = state.nodes[:2], state.nodes[2]
        client.drain(suspect, REASON)
        # a step on the drained node, inside the job: what the in-allocation diagnosis runs
        t0 = time.monotonic()
        probe = _run(env, "srun", f"--jobid={job_id}", "-N1", "-n1", f"--nodelist={suspect}", "hostname")
        probe_s = time.monotonic() - t0
        assert probe.returncode == 0, probe.stderr
        # release it: the running job shrinks to the nodes it keeps
        t0 = time.monotonic()
        shrink = _run(env, "scontrol", "update", f"JobId={job_id}", f"NodeList={','.join(keep)}")
        shrink_s = time.monotonic() - t0
        assert shrink.returncode == 0, shrink.stderr + shrink.stdout
        after = client.job(job_id)
        assert after.status is JobStatus.RUNNING and after.nodes == keep, after.describe()
        node = client.node(suspect)
        assert node.drain_flag and node.reason == REASON, node
        # a step on the released node is refused; one on the kept nodes runs
        refused = _run(env, "srun", f"--jobid={job_id}", "-N1", "-n1", f"--nodelist={suspect}", "true")
        assert refused.returncode != 0
        step = _run(env, "srun", f"--jobid={job_id}", "-N2", "-n2", f"--nodelist={','.join(keep)}", "true")
        assert step.returncode == 0, step.stderr
        print(f"\nKEEP-ALLOCATION probe step on the drained node {probe_s:.2f} s; shrink {shrink_s:.2f} s")
    finally:
        client.cancel(job_id)
        ops.wait_for(client, job_id, lambda s: s.is_terminal, timeout_s=60)
        if suspect is not None and client.node(suspect).reason == REASON:
            client.resume(suspect)
    assert not any(n.drain_flag and n.reason == REASON for n in client.nodes())
