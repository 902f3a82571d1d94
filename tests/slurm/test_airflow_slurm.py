"""The Airflow side of the Slurm layer: trigger serialization, deferral, reattach, event handling.

Operators run outside a scheduler here (their `execute` is called with a context built for the test);
the DAG-level behaviour through a real scheduler and triggerer is in test_example_dag.py. Slurm is real.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import textwrap
from dataclasses import dataclass, field
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from longrun.hooks.slurm import SlurmHook
from longrun.operators.slurm import SUBMITTING_KEY, SlurmSubmitJobOperator, finish
from longrun.sensors.slurm import SlurmJobSensor
from longrun.slurm.errors import InvalidSpecError, SlurmUnavailableError
from longrun.slurm.spec import JobSpec
from longrun.triggers.slurm import SlurmJobTrigger

JOB = {"name": "af", "partition": "debug", "gpus_per_node": 0, "exclusive": False, "time_limit_min": 5}


def test_trigger_serialize_round_trip_exact_kwargs():
    t = SlurmJobTrigger(job_id=42, slurm_conf="/etc/slurm/slurm.conf", backend="cli", max_restarts=2)
    path, kwargs = t.serialize()
    assert path == "longrun.triggers.slurm.SlurmJobTrigger"
    assert kwargs == {
        "job_id": 42,
        "slurm_conf": "/etc/slurm/slurm.conf",
        "backend": "cli",
        "poll_interval": 1.0,
        "max_poll_interval": 10.0,
        "max_restarts": 2,
        "max_consecutive_errors": 30,
    }
    module, _, name = path.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (path, kwargs)


def test_operator_refuses_a_comment_and_bad_specs_at_parse_time():
    with pytest.raises(ValueError, match="comment"):
        SlurmSubmitJobOperator(task_id="t", job={**JOB, "command": ["true"], "comment": "x"})
    with pytest.raises(InvalidSpecError, match="^name"):
        SlurmSubmitJobOperator(task_id="t", job={**JOB, "name": "--wrap=id", "command": ["true"]})
    # Templated values are checked when rendered, at run time.
    SlurmSubmitJobOperator(task_id="t", job={**JOB, "name": "{{ params.name }}", "command": ["true"]})


@pytest.mark.parametrize(
    ("event", "error", "match"),
    [
        (None, AirflowFailException, "malformed"),
        ({"status": "done"}, AirflowFailException, "malformed"),
        ({"status": "weird", "job_id": 1}, AirflowFailException, "unknown"),
        ({"status": "error", "job_id": 1, "retryable": True, "message": "m"}, SlurmUnavailableError, "m"),
        ({"status": "error", "job_id": 1, "retryable": False, "message": "m"}, AirflowFailException, "m"),
    ],
)
def test_finish_validates_events(event, error, match):
    with pytest.raises(error, match=match):
        finish(SlurmHook(None, slurm_conf="/nonexistent", backend="cli"), event, max_restarts=None)


# --- against the real cluster ----------------------------------------------------------------------


@dataclass
class Store:
    """The task state store's interface (get/set), kept in memory across the test's 'tries'."""

    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, **_: Any) -> None:
        self.data[key] = value


@dataclass
class TI:
    """The task instance fields the operator reads."""

    dag_id: str
    run_id: str
    task_id: str
    try_number: int = 1
    map_index: int = -1
    stats_tags: dict[str, str] = field(default_factory=dict)
    xcom: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def context(ti: TI, store: Store) -> dict[str, Any]:
    return {"ti": ti, "task_state_store": store}


def run_trigger(trigger: SlurmJobTrigger, timeout_s: float = 60) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout_s))


@pytest.fixture
def slurm_env(slurm_cluster, monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    hook = SlurmHook(None)
    yield {"workdir": str(tmp_path), "output": f"{tmp_path}/slurm-%j.out"}
    for state in hook.find_jobs("longrun/test_af/"):
        hook.cancel(state.job_id)


@pytest.mark.slurm
def test_operator_defers_and_completes(slurm_env, request):
    op = SlurmSubmitJobOperator(
        task_id="ok", job={**JOB, **slurm_env, "command": ["echo hi"]}, poll_interval=0.5
    )
    ti = TI(dag_id="test_af", run_id=request.node.name.replace("[", "_").replace("]", ""), task_id="ok")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context(ti, Store()))
    trigger = deferred.value.trigger
    assert isinstance(trigger, SlurmJobTrigger) and deferred.value.method_name == "execute_complete"
    assert ti.xcom["slurm_job_id"] == trigger.job_id
    event = run_trigger(trigger)
    assert (event["status"], event["label"], event["state"]["exit_code"]) == ("done", "completed", 0)
    result = op.execute_complete(context(ti, Store()), event)
    assert result["status"] == "completed" and result["job_id"] == trigger.job_id


@pytest.mark.slurm
def test_failed_job_fails_the_task_with_slurm_reason_and_exit_code(slurm_env):
    op = SlurmSubmitJobOperator(
        task_id="fail", job={**JOB, **slurm_env, "command": ["exit 3"]}, poll_interval=0.5
    )
    ti = TI(dag_id="test_af", run_id="fail", task_id="fail")
    store = Store()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context(ti, store))
    event = run_trigger(deferred.value.trigger)
    assert event["label"] == "failed"
    with pytest.raises(AirflowFailException, match=r"FAILED reason=NonZeroExitCode exit_code=3"):
        op.execute_complete(context(ti, store), event)
    # Should Airflow retry the task anyway (its own races can), the retry fails with the same verdict
    # and submits nothing, whether it finds the job by the stored id or only by its tag (after a try that
    # began a submission and died before the id was stored).
    for s in (store, Store({SUBMITTING_KEY: "longrun/test_af/fail/fail/-1/"})):
        retry = TI(dag_id="test_af", run_id="fail", task_id="fail", try_number=2)
        with pytest.raises(AirflowFailException, match=r"exit_code=3"):
            op.execute(context(retry, s))
    assert len(SlurmHook(None).find_jobs("longrun/test_af/fail/fail/")) == 1


@pytest.mark.slurm
def test_retry_reattaches_instead_of_submitting_twice(slurm_env):
    hook = SlurmHook(None)
    job = {**JOB, **slurm_env, "command": ["sleep 60"]}
    store = Store()
    first = TI(dag_id="test_af", run_id="reattach", task_id="long", try_number=1)
    with pytest.raises(TaskDeferred) as d1:
        SlurmSubmitJobOperator(task_id="long", job=job).execute(context(first, store))
    # Try 2 with the stored id (the mixin's path).
    second = TI(dag_id="test_af", run_id="reattach", task_id="long", try_number=2)
    with pytest.raises(TaskDeferred) as d2:
        SlurmSubmitJobOperator(task_id="long", job=job).execute(context(second, store))
    # Try 3 after the worker died between sbatch and storing the id: found by its tag.
    third = TI(dag_id="test_af", run_id="reattach", task_id="long", try_number=3)
    began = Store({SUBMITTING_KEY: "longrun/test_af/reattach/long/-1/"})
    with pytest.raises(TaskDeferred) as d3:
        SlurmSubmitJobOperator(task_id="long", job=job).execute(context(third, began))
    ids = {d.value.trigger.job_id for d in (d1, d2, d3)}
    assert len(ids) == 1
    assert [s.job_id for s in hook.find_jobs("longrun/test_af/reattach/long/")] == list(ids)


@pytest.mark.slurm
def test_a_job_planted_with_the_tasks_tag_before_its_first_try_is_not_adopted(slurm_env):
    """A job tag is Slurm's public `--comment` and a DAG run id can be predicted: a job planted with the
    task's tag before it ran was adopted as its job (and its alert key bound to that job). Only after a
    try that began a submission is a job found by the tag alone believed."""
    hook = SlurmHook(None)
    planted = hook.submit(
        JobSpec.from_dict(
            {**JOB, **slurm_env, "comment": "longrun/test_af/planted/long/-1/1", "command": ["sleep 60"]}
        )
    )
    first = TI(dag_id="test_af", run_id="planted", task_id="long", try_number=1)
    store = Store()
    with pytest.raises(TaskDeferred) as deferred:
        SlurmSubmitJobOperator(task_id="long", job={**JOB, **slurm_env, "command": ["sleep 60"]}).execute(
            context(first, store)
        )
    assert deferred.value.trigger.job_id != planted
    assert store.data[SUBMITTING_KEY] == "longrun/test_af/planted/long/-1/"
    assert hook.job_state(planted).is_active  # someone's job: left as it is


@pytest.mark.slurm
def test_a_stored_id_that_names_another_job_is_not_reattached_and_a_kill_cancels_nothing(slurm_env):
    """Slurm gives a lost job's id to the next submission (a slurmctld that died before saving it). Here
    the id the task stored names someone else's running job: the retry must submit its own job instead of
    reconnecting to that one (and binding its key to it), and a kill must leave that job alone."""
    hook = SlurmHook(None)
    other = hook.submit(
        JobSpec.from_dict(
            {**JOB, **slurm_env, "name": "someone-else", "comment": "longrun/test_af/other/x/-1/1",
             "command": ["sleep 60"]}
        )
    )  # fmt: skip
    store = Store({"slurm_job_id": other})
    retry = TI(dag_id="test_af", run_id="reused", task_id="long", try_number=2)
    op = SlurmSubmitJobOperator(task_id="long", job={**JOB, **slurm_env, "command": ["sleep 60"]})
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context(retry, store))
    own = deferred.value.trigger.job_id
    assert own != other and hook.job_state(own).comment.startswith("longrun/test_af/reused/long/")
    op._job_id = other  # as if the task had reconnected to the id before (the old behaviour)
    op.on_kill()
    assert hook.job_state(other).is_active
    op._job_id = own
    op.on_kill()  # its own job: cancelled
    assert hook.job_state(own).status.value in ("cancelled", "completing")


@pytest.mark.slurm
def test_sensor_defers_until_done_and_on_kill_cancels(slurm_env):
    hook = SlurmHook(None)
    op = SlurmSubmitJobOperator(
        task_id="submit", job={**JOB, **slurm_env, "command": ["sleep 60"]}, wait_for_completion=False
    )
    ti = TI(dag_id="test_af", run_id="sensor", task_id="submit")
    job_id = op.execute(context(ti, Store()))
    assert isinstance(job_id, int) and ti.xcom["slurm_job_id"] == job_id
    sensor = SlurmJobSensor(task_id="wait", job_id=str(job_id), poll_interval=0.5)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context(TI(dag_id="test_af", run_id="sensor", task_id="wait"), Store()))
    op.on_kill()  # what Airflow calls when the submitting task is killed
    event = run_trigger(deferred.value.trigger)
    assert event["label"] == "cancelled" and hook.job_state(job_id).status.value == "cancelled"
    with pytest.raises(AirflowFailException, match="CANCELLED"):
        sensor.execute_complete({}, event)


def test_trigger_yields_an_error_event_instead_of_raising(tmp_path):
    conf = tmp_path / "missing.conf"  # every Slurm command fails: no such configuration
    event = run_trigger(SlurmJobTrigger(job_id=1, slurm_conf=str(conf), backend="cli"), timeout_s=30)
    assert event["status"] == "error" and event["job_id"] == 1 and event["retryable"] is False
    assert event["message"]


@pytest.mark.slurm
def test_trigger_never_blocks_the_event_loop(slurm_env, tmp_path):
    """While the trigger's Slurm command runs, the event loop runs other code.

    Shown by the order of events, not by tick gaps: `scontrol` is wrapped so that each call holds until a
    task on the same loop has seen it in flight, then runs the real one. A call made on the loop's thread
    would hold the loop too: the task could not see it, the call gives up waiting and says so."""
    hook = SlurmHook(None)
    job = hook.submit(
        JobSpec(**{**JOB, **slurm_env}, command=["sleep 4"], comment="longrun/test_af/loop/t/-1/1")
    )
    real = shutil.which("scontrol")
    assert real, "scontrol is not on PATH"
    calls, bindir = tmp_path / "calls", tmp_path / "bin"
    calls.mkdir()
    bindir.mkdir()
    wrapper = bindir / "scontrol"
    wrapper.write_text(
        textwrap.dedent(f"""\
            #!/bin/sh
            # held until the loop's watcher marks it seen (400 polls at most, under the client's 30 s timeout)
            touch "{calls}/call.$$"
            i=0
            while [ ! -e "{calls}/seen.$$" ] && [ "$i" -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
            [ -e "{calls}/seen.$$" ] || touch "{calls}/unseen.$$"
            exec "{real}" "$@"
            """)
    )
    wrapper.chmod(0o755)
    trigger = SlurmJobTrigger(job_id=job, slurm_conf=hook.slurm_conf, backend="cli", poll_interval=0.1)

    async def main() -> dict[str, Any]:
        done = asyncio.Event()

        async def watcher() -> None:  # runs only when the loop is free
            while not done.is_set():
                for call in calls.glob("call.*"):
                    (calls / call.name.replace("call.", "seen.")).touch()
                await asyncio.sleep(0.05)

        watch = asyncio.create_task(watcher())
        try:
            async for event in trigger.run():
                return event.payload
            raise AssertionError("no event")
        finally:
            done.set()
            await watch

    with pytest.MonkeyPatch.context() as mp:  # the wrapper only for this trigger, not for the teardown
        mp.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
        payload = asyncio.run(asyncio.wait_for(main(), 300))
    assert payload["label"] == "completed", payload
    made = sorted(c.name for c in calls.glob("call.*"))
    assert made, "the trigger never ran the wrapped scontrol"
    unseen = sorted(c.name for c in calls.glob("unseen.*"))
    assert not unseen, f"{len(unseen)} of {len(made)} scontrol calls held the event loop"
