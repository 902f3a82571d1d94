"""The in-job supervisor on the real four-node cluster: a 3-node job (2-node steps + 1 spare) whose first
step ends with the SDC verdict. With the orchestrator's directive it runs the next step inside the same
job on the directed nodes from the directed checkpoint; without one in time, or with one it must refuse,
it exits 93 (the full relaunch's cue). The step here is a small srun script, not the trainer (the trainer
under the supervisor is the e2e drill's business). Every job and node is restored, also on failure."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest
from longrun.slurm import ops
from longrun.slurm.factory import make_client
from longrun.slurm.models import JobStatus
from longrun.slurm.spec import JobSpec

from training.records.schema import store_key
from training.spares.directive import Directive
from training.store.interface import put_json
from training.store.local import LocalDirStore

pytestmark = [pytest.mark.slurm]

REASON = "longrun:test:supervisor"
CKPT = "runs/sv/checkpoints/step-00000010/"


@pytest.fixture
def client(slurm_cluster):
    return make_client(backend="cli", slurm_conf=slurm_cluster.env["SLURM_CONF"])


def _job(tmp: Path, partition: str, wait_s: float) -> JobSpec:
    out = shlex.quote(str(tmp))
    step = (
        'srun --export=ALL -N "$LONGRUN_STEP_NNODES" -n "$LONGRUN_STEP_NNODES" --nodelist="$LONGRUN_STEP_NODES" bash -c '
        f"'echo \"$SLURMD_NODENAME $LONGRUN_ATTEMPT $LONGRUN_RESUME_FROM\" >> {out}/steps.txt'; "
        f'if [ "$LONGRUN_ATTEMPT" = 0 ]; then touch {out}/verdict; exit 93; fi'
    )
    command = (
        f"{shlex.quote(sys.executable)} -m training.spares.supervisor --run-name sv --width 2 --spares 1"
        f" --wait-s {wait_s:g} --poll-s 0.2 --step {shlex.quote(step)}"
    )
    return JobSpec(
        name="sv", partition=partition, command=(command,), comment="longrun/test/sv/supervise/-1/1",
        nodes=3, gpus_per_node=0, exclusive=False, time_limit_min=5, workdir=str(tmp), output="sv-%j.out",
        env={"LONGRUN_STORE_DIR": str(tmp / "store")},
    )  # fmt: skip


def _steps(tmp: Path) -> list[tuple[str, str, str]]:
    path = tmp / "steps.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return sorted(tuple((line.split(" ") + ["", ""])[:3]) for line in lines)  # type: ignore[misc]


def _wait_file(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout_s} s")
        time.sleep(0.2)


def _directive(job: int, nodes: list[str], exclude: list[str], **kw) -> Directive:
    base = dict(run="sv", job_id=str(job), attempt=1, nodes=tuple(nodes), resume_from=CKPT,
                incident_id="i1", exclude=tuple(exclude), issued_at=time.time())  # fmt: skip
    return Directive(**{**base, **kw})


def _scenario(tmp_path, client, slurm_cluster, *, wait_s, act):
    job_id = client.submit(_job(tmp_path, slurm_cluster.partition, wait_s))
    store = LocalDirStore(tmp_path / "store")
    suspect = None
    try:
        state = ops.wait_status(client, job_id, {JobStatus.RUNNING}, timeout_s=60)
        assert len(state.nodes) == 3, state.describe()
        _wait_file(tmp_path / "verdict", 60)
        suspect = act(job_id, list(state.nodes), store)
        final = ops.wait_for(client, job_id, lambda s: s.is_terminal, timeout_s=120)
        return job_id, list(state.nodes), final
    finally:
        client.cancel(job_id)
        ops.wait_for(client, job_id, lambda s: s.is_terminal, timeout_s=60)
        if suspect is not None and client.node(suspect).reason == REASON:
            client.resume(suspect)


def test_a_directive_relaunches_inside_the_same_job(tmp_path, client, slurm_cluster):
    import subprocess

    def act(job_id, nodes, store):
        first, suspect, spare = nodes
        client.drain(suspect, REASON)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", f"NodeList={first},{spare}"],
                       env=slurm_cluster.client_env(), check=True, timeout=30)  # fmt: skip
        d = _directive(job_id, [first, spare], [suspect])
        put_json(store, store_key("sv", d.relative_path), d.to_json())
        return suspect

    job_id, nodes, final = _scenario(tmp_path, client, slurm_cluster, wait_s=60, act=act)
    first, suspect, spare = nodes
    assert final.status is JobStatus.COMPLETED and final.exit_code == 0, final.describe()
    assert final.job_id == job_id
    assert _steps(tmp_path) == sorted(
        [(first, "0", ""), (suspect, "0", ""), (first, "1", CKPT), (spare, "1", CKPT)]
    )
    out = (tmp_path / f"sv-{job_id}.out").read_text()
    assert "directive of incident i1" in out, out


def test_no_directive_in_time_exits_93(tmp_path, client, slurm_cluster):
    job_id, nodes, final = _scenario(tmp_path, client, slurm_cluster, wait_s=2, act=lambda *a: None)
    assert final.exit_code == 93, final.describe()
    assert {s[1] for s in _steps(tmp_path)} == {"0"}


@pytest.mark.parametrize("forged", ["job", "attempt", "node outside"])
def test_a_directive_it_must_refuse_ends_in_93(tmp_path, client, slurm_cluster, forged):
    """Attack: a directive under this job's key that names another job, another attempt or a node the
    job does not hold. Without the supervisor's checks the job would train on it."""

    def act(job_id, nodes, store):
        first, _, spare = nodes
        change = {"job": {"job_id": str(job_id + 1000)}, "attempt": {"attempt": 2},
                  "node outside": {"nodes": (first, "n9")}}[forged]  # fmt: skip
        d = _directive(job_id, list(change.pop("nodes", (first, spare))), [], **change)
        put_json(store, store_key("sv", f"directives/{job_id}-a001.json"), d.to_json())
        return None

    job_id, _, final = _scenario(tmp_path, client, slurm_cluster, wait_s=30, act=act)
    assert final.exit_code == 93, final.describe()
    assert {s[1] for s in _steps(tmp_path)} == {"0"}
    assert "directive REFUSED" in (tmp_path / f"sv-{job_id}.out").read_text()


def test_directive_records_are_checked():
    d = _directive(7, ["n1", "n3"], ["n2"])
    assert Directive.from_json(json.dumps(d.to_json())) == d
    assert d.relative_path == "directives/7-a001.json"
    for change, field in [({"attempt": 0}, "attempt"), ({"job_id": "x"}, "job_id"), ({"nodes": ["n2"]}, "nodes"),
                          ({"resume_from": "../x"}, "resume_from"), ({"kind": "alert"}, "kind"),
                          ({"issued_at": "now"}, "issued_at")]:  # fmt: skip
        with pytest.raises(ValueError, match=field):
            Directive.from_json({**d.to_json(), **change})
    ok = {"run": "sv", "job_id": "7", "attempt": 1, "allocation": ["n1", "n3"], "width": 2}
    assert d.refusal(**ok) is None
    assert "run" in d.refusal(**{**ok, "run": "other"})
    assert "width" not in (d.refusal(**{**ok, "width": 3}) or "") and "needs 3" in d.refusal(
        **{**ok, "width": 3}
    )
