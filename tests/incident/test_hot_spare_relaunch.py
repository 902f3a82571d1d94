"""sdc_incident's hot-spare path on the real four-node cluster (longrun.incident.hot_spare): freeze keeps the
job, relaunch leaves the drained suspect in the allocation for its diagnosis step (which then releases
it; it stays drained with longrun's reason), writes the directive and sees the supervisor start the attempt inside the same job; with no spare left it
returns None and the kept job is cancelled for the full relaunch; approve and observe modes never keep
the job. The job's training step is a small srun script that writes the trainer's segment record (the
trainer under the supervisor is tests/nvrx/test_hot_spare.py's business). Every job and node is
restored, also on failure."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from longrun import alert_auth
from longrun.incident import hot_spare, record
from longrun.incident.events import Event
from longrun.incident.runner import Incident, IncidentStop
from longrun.monitor import lifecycle
from longrun.slurm import ops
from longrun.slurm.errors import SlurmUnavailableError
from longrun.slurm.factory import make_client
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec, JobTag

from training.records import schema, signing
from training.spares.directive import Directive
from training.store.interface import get_json
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm]

CKPT = "runs/ij/checkpoints/step-00000010/"
REASON = "longrun:sdc:ij:12"
TAG = JobTag(dag_id="training_run", run_id="ij", task_id="submit")
SEGMENT = """
import sys, time, os
from training.segment import Segment, segment_id
from training.store.interface import put_json
from training.store.local import LocalDirStore
t = time.time()
job, attempt = os.environ["SLURM_JOB_ID"], os.environ["LONGRUN_ATTEMPT"]
s = Segment(run="ij", segment_id=segment_id(job_id=job, job_step=attempt, restart_count=0, started_at=t),
            job_id=job, restart_count=0, start_step=10, resumed_from=os.environ["LONGRUN_RESUME_FROM"],
            started_at=t, world_size=2, nodes=tuple(os.environ["LONGRUN_STEP_NODES"].split(",")))
put_json(LocalDirStore(sys.argv[1]), "runs/ij/" + s.relative_path, s.to_json())
"""


@pytest.fixture
def client(slurm_cluster):
    return make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])


def _job(tmp: Path, partition: str) -> JobSpec:
    (tmp / "segment.py").write_text(SEGMENT)
    out, py = shlex.quote(str(tmp)), shlex.quote(sys.executable)
    step = (
        f'if [ "$LONGRUN_ATTEMPT" = 0 ]; then touch {out}/verdict; exit 93; fi; '
        f"{py} {out}/segment.py {out}/store; sleep 300"
    )
    # The job runs until the test's fixture cancels it, not for a fixed time the test must finish in:
    # a loaded host may be slow.
    command = (
        f"{py} -m training.spares.supervisor --run-name ij --width 2 --spares 1 --wait-s 240 --poll-s 0.2"
        f" --step {shlex.quote(step)}"
    )
    return JobSpec(
        name="ij", partition=partition, command=(command,), comment=TAG.render(), nodes=3,
        gpus_per_node=0, exclusive=False, time_limit_min=5, workdir=str(tmp), output="ij-%j.out",
        env={"LONGRUN_STORE_DIR": str(tmp / "store")},
    )  # fmt: skip


def _incident(store, job_id: int, node: str, mode: str = "act", *, signed: bool = True) -> Incident:
    alert = schema.record("alert", run="ij", step=12, check="finite", suspect_ranks=[1], suspect_nodes=[node],
                          evidence={}, job_id=job_id)  # fmt: skip
    if signed:  # with the key the orchestrator issued for this job, as the trainer signs its alerts
        alert = signing.sign(alert, alert_auth.issue(store, run="ij", tag=TAG.render()))
        alert_auth.bind(store, run="ij", tag=TAG.render(), job_id=job_id)  # as the submit does
    key = schema.store_key("ij", schema.alert_path(12, "finite", "r001-1"))
    params = {"run_name": "ij", "nodes": 2, "spare_nodes": 1, "gpus_per_node": 0, "incident_mode": mode}
    inc = Incident(run="ij", alert_key=key, alert=alert, job_id=job_id, run_params=params, dag_run_id="t")
    record.open_incident(store, run="ij", alert=alert, alert_key=key, mode=mode)
    return inc


@pytest.fixture
def running(tmp_path, client, slurm_cluster):
    job_id = client.submit(_job(tmp_path, slurm_cluster.partition))
    drained: list[str] = []
    try:
        state = ops.wait_status(client, job_id, {JobStatus.RUNNING}, timeout_s=60)
        deadline = time.monotonic() + 60
        while not (tmp_path / "verdict").exists():
            assert time.monotonic() < deadline, "the first step never ended with the verdict"
            time.sleep(0.2)
        yield job_id, list(state.nodes), LocalDirStore(tmp_path / "store"), drained
    finally:
        client.cancel(job_id)
        ops.wait_for(client, job_id, lambda s: s.is_terminal, timeout_s=60)
        for n in drained:
            if client.node(n).reason == REASON:
                client.resume(n)


def test_act_mode_recovers_inside_the_job(client, running):
    job_id, held, store, drained = running
    inc = _incident(store, job_id, held[1])
    assert hot_spare.freeze_kept(store, client, inc)["kept"] is True
    suspect = held[1]
    client.drain(suspect, REASON)
    drained.append(suspect)
    out = hot_spare.direct(store, client, inc, node=suspect, checkpoint={"key": CKPT, "step": 10})
    assert out is not None and out["in_job"] and out["job_id"] == job_id
    assert out["nodes"] == [held[0], held[2]] and out["params"]["spare_nodes"] == 0
    # what reenter_monitoring hands to training_run: its declared params only (closed conf)
    lifecycle.check_declared({**out["params"], "attach_job_id": job_id, "incident_id": inc.incident_id})
    state = client.job(job_id)  # the suspect stays held, drained, until its diagnosis step has run
    assert state.status is JobStatus.RUNNING and list(state.nodes) == held
    d = Directive.from_json(get_json(store, schema.store_key("ij", f"directives/{job_id}-a001.json")))
    assert (d.nodes, d.resume_from, d.exclude) == ((held[0], held[2]), CKPT, (suspect,))
    rec = inc.rec(store)
    events = [e.event for e in rec.timeline]
    assert {Event.FROZEN, Event.RELEASE_DEFERRED, Event.DIRECTIVE_WRITTEN, Event.RELAUNCHED_RUNNING} <= set(
        events
    )
    assert Event.RELEASED not in events
    assert rec.status == record.RELAUNCHED
    # a rerun changes nothing: same result, no second directive, no second event
    hot_spare.direct(store, client, inc, node=suspect, checkpoint={"key": CKPT})
    assert [e.event for e in inc.rec(store).timeline] == events
    assert [o.key for o in store.list(schema.store_key("ij", "directives/"))] == [
        schema.store_key("ij", f"directives/{job_id}-a001.json")
    ]
    # what the diagnosis does after its step (longrun.incident.hot_spare): the node leaves the job, drained
    assert hot_spare.release(store, client, inc, suspect) is True
    assert list(client.job(job_id).nodes) == [held[0], held[2]]
    node = client.node(suspect)
    assert node.drain_flag and node.reason == REASON
    assert record.has_event(inc.rec(store), Event.RELEASED)


def test_no_spare_left_falls_back_and_the_kept_job_is_cancelled(client, running, slurm_cluster):
    job_id, held, store, drained = running
    inc = _incident(store, job_id, held[1])
    hot_spare.freeze_kept(store, client, inc)
    # someone took the spare: the job holds only two nodes
    subprocess.run(["scontrol", "update", f"JobId={job_id}", f"NodeList={held[0]},{held[1]}"],
                   env=slurm_cluster.client_env(), check=True, timeout=30)  # fmt: skip
    assert hot_spare.direct(store, client, inc, node=held[1], checkpoint={"key": CKPT}) is None
    assert record.has_event(inc.rec(store), Event.NO_SPARE_LEFT)
    hot_spare.end_kept(store, client, inc)
    assert client.job(job_id).is_terminal
    assert list(store.list(schema.store_key("ij", "directives/"))) == []


def test_a_kept_job_that_ended_on_its_own_falls_back_and_says_so(client, running):
    """Freeze kept the job, and it failed before the relaunch came (a fault-matrix cell saw its supervisor
    end while the store was down): the full relaunch takes over, and the timeline says why."""
    job_id, held, store, drained = running
    inc = _incident(store, job_id, held[1])
    hot_spare.freeze_kept(store, client, inc)
    client.cancel(job_id)
    ops.wait_for(client, job_id, lambda s: s.is_terminal, timeout_s=60)
    assert hot_spare.direct(store, client, inc, node=held[1], checkpoint={"key": CKPT}) is None
    ended = inc.rec(store).event(Event.KEPT_JOB_ENDED)
    assert ended is not None and ended.details["job_id"] == job_id, inc.rec(store).timeline
    assert f"job {job_id} CANCELLED" in ended.details["state"], ended.details
    assert list(store.list(schema.store_key("ij", "directives/"))) == []


@pytest.mark.parametrize("mode", ["approve", "observe"])
def test_approve_and_observe_never_keep_the_job(client, running, mode):
    job_id, held, store, _ = running
    inc = _incident(store, job_id, held[1], mode=mode)
    assert hot_spare.freeze_kept(store, client, inc) is None
    assert hot_spare.direct(store, client, inc, node=held[1], checkpoint={"key": CKPT}) is None
    assert client.job(job_id).status is JobStatus.RUNNING and len(client.job(job_id).nodes) == 3


def test_a_forged_alert_releases_nothing(client, running):
    """Attack: an unsigned alert naming a node of the job. The hot-spare path must not release the node
    or direct anything on it."""
    job_id, held, store, _ = running
    inc = _incident(store, job_id, held[1], signed=False)
    with pytest.raises(IncidentStop, match="not acted on"):
        hot_spare.direct(store, client, inc, node=held[1], checkpoint={"key": CKPT})
    assert len(client.job(job_id).nodes) == 3
    assert list(store.list(schema.store_key("ij", "directives/"))) == []


def test_a_drained_node_is_never_directed(client, running):
    """An earlier suspect the job still holds (its release refused) is drained: the directive must not
    train on it, so with it and the new suspect out there is no spare left."""
    job_id, held, store, drained = running
    inc = _incident(store, job_id, held[1])
    hot_spare.freeze_kept(store, client, inc)
    for n in (held[1], held[2]):
        client.drain(n, REASON)
        drained.append(n)
    assert hot_spare.direct(store, client, inc, node=held[1], checkpoint={"key": CKPT}) is None
    assert record.has_event(inc.rec(store), Event.NO_SPARE_LEFT)
    assert list(store.list(schema.store_key("ij", "directives/"))) == []


def _step(slurm_cluster, job_id: int, node: str, name: str) -> subprocess.Popen:
    """A step of the job named `name` on `node`, running until stopped (what squeue -s then lists)."""
    argv = ["srun", f"--jobid={job_id}", f"--nodelist={node}", "-N1", "-n1", "--overlap", f"--job-name={name}",
            "sleep", "300"]  # fmt: skip
    return subprocess.Popen(argv, env=slurm_cluster.client_env(), start_new_session=True)


def _listed(client, job_id: int, name: str) -> None:
    deadline = time.monotonic() + 60
    while name not in [n for _, n in client.job_steps(job_id)]:
        assert time.monotonic() < deadline, f"step {name} never started"
        time.sleep(0.2)


def test_no_directive_while_the_alerting_attempts_step_still_runs(client, running, slurm_cluster):
    """The standby starts at the alert, beside the alerting step: the directive waits for that step's end
    (bounded), else the incident falls back. The standby's own step and a diagnostic step do not count."""
    job_id, held, store, drained = running
    inc = _incident(store, job_id, held[1])
    hot_spare.freeze_kept(store, client, inc)
    client.drain(held[1], REASON)
    drained.append(held[1])
    steps = {name: _step(slurm_cluster, job_id, held[0], name)
             for name in ("longrun-attempt-0", "longrun-attempt-1", "longrun-diag-step")}  # fmt: skip
    try:
        for name in steps:
            _listed(client, job_id, name)
        assert [s.split(" ")[1] for s in hot_spare.earlier_steps(client, job_id, 1, timeout_s=0)] == [
            "(longrun-attempt-0)"
        ]
        out = hot_spare.direct(
            store, client, inc, node=held[1], checkpoint={"key": CKPT}, earlier_step_timeout_s=1
        )
        assert out is None
        ev = inc.rec(store).event(Event.EARLIER_STEP_RUNNING)
        assert ev is not None and ev.details["attempt"] == 1 and "longrun-attempt-0" in ev.details["steps"][0]
        assert list(store.list(schema.store_key("ij", "directives/"))) == []
        # the alerting step ends: the relaunch (a rerun of the task) writes the directive
        steps["longrun-attempt-0"].terminate()
        steps["longrun-attempt-0"].wait(timeout=60)
        out = hot_spare.direct(
            store, client, inc, node=held[1], checkpoint={"key": CKPT}, earlier_step_timeout_s=60
        )
        assert out is not None and out["nodes"] == [held[0], held[2]]
    finally:
        for proc in steps.values():
            proc.terminate()
            proc.wait(timeout=60)


class _NoBatchHost:
    """The real client, except that Slurm fails to answer the batch-host question (a controller that
    drops out between two calls cannot be arranged at an exact call on the real cluster)."""

    def __init__(self, client, answer):
        self._client, self._answer = client, answer

    def batch_host(self, job_id: int):
        if isinstance(self._answer, Exception):
            raise self._answer
        return self._answer

    def __getattr__(self, name):
        return getattr(self._client, name)


@pytest.mark.parametrize("answer", [SlurmUnavailableError("slurmctld not responding"), None])
def test_a_node_is_never_released_without_proof_that_it_is_not_the_batch_host(client, running, answer):
    job_id, nodes, store, _ = running
    suspect = nodes[-1]
    inc = _incident(store, job_id, suspect)
    assert hot_spare.release(store, _NoBatchHost(client, answer), inc, suspect) is False
    assert client.job(job_id).nodes == tuple(nodes)  # the job still holds every node
    (refused,) = [e for e in record.load(store, run="ij", incident_id=inc.incident_id)["timeline"]
                  if e["event"] == Event.RELEASE_REFUSED]  # fmt: skip
    assert refused["node"] == suspect
