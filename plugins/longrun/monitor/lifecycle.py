"""The non-monitoring steps of `training_run`, as plain functions: preflight, the job spec, the finish.

Where a launch puts things (the submitting environment decides, so the DAG files stay declarative):
    LONGRUN_JOB_USER   the unprivileged Unix user jobs run as (longrun.runroot; unset: the workers' own
                       user, which leaves the job every right the orchestrator has: docs/security.md)
    LONGRUN_RUN_ROOT   directory for run dirs, visible on every node and writable by the jobs' user
                       (default: <tmp>/longrun-runs, made 0700 for the jobs' user and refused when someone
                       else owns it or may write it, longrun.runroot; on a real cluster set it to a shared
                       filesystem)
    the interpreter    the run's `job_python` (one of the site's LONGRUN_JOB_PYTHONS), else the Airflow
                       worker's own (`sys.executable`): that environment has longrun's job side, the
                       entrypoint and NVRx's ft_launcher; on a cluster, point workers at that venv
    LONGRUN_ENTRYPOINT_DIR, LONGRUN_JOB_PYTHONS   what a run may launch (longrun.entrypoint)
The job's environment is an allow-list (`longrun.launch.JOB_EXPORT` plus the store's plain settings in
the script); store credentials and the alert key reach it by name at submit, never in the script.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from longrun import drillcheck, runroot
from longrun.alert_auth import SECRET_STORE_ENV
from longrun.checkpoints import catalog
from longrun.launch import job_spec_for_run, run_dir_for
from longrun.monitor import segments
from longrun.monitor.gate import gate_checkpoint
from longrun.runspec import RunSpec
from longrun.runview import RunView
from longrun.slurm.client import SlurmClient
from longrun.slurm.spec import JobSpec, JobTag
from longrun.store_access import job_store_env
from training.records import schema
from training.records.orchestrator import Incident
from training.store.interface import ObjectStore, StoreError, put_json

#: training_run params that are not RunSpec fields: how this DAG run relates to the run's history.
ATTACH_PARAMS = ("attach_job_id", "incident_id")
#: Environment names a job needs to find the store (values are not secret; keys travel by export).
STORE_ENV = ("AWS_ENDPOINT_URL", "LONGRUN_BUCKET", "LONGRUN_STORE_DIR", "AWS_DEFAULT_REGION")
#: The keys `training_run` declares (dags/training_run.py; tests/test_contracts.py pins the two equal).
#: A run's params are closed: any other key (RunSpec's extra_env, max_restarts, seed, ...) is refused,
#: so neither a trigger's conf nor an incident's run_params reaches a RunSpec field the form hides.
RUN_PARAMS = (
    "run_name",
    "nodes",
    "spare_nodes",
    "gpus_per_node",
    "ranks_per_node",
    "parallelism",
    "partition",
    "model",
    "entrypoint",
    "entrypoint_args",
    "job_python",
    "steps",
    "checkpoint_every",
    "recompute_every",
    "vote_every",
    "incident_mode",
    "drill",
    "attach_job_id",
    "resume_from",
    "exclude",
    "attempt",
    "incident_id",
)

#: The keys sdc_incident declares (dags/sdc_incident.py; pinned the same way).
INCIDENT_PARAMS = ("run_name", "alert_key", "alert", "job_id", "run_params", "alert_seen_at")


class UndeclaredParamError(ValueError):
    """A run parameter the DAG does not declare. The message names the key."""


def check_declared(params: Mapping[str, Any], declared: tuple[str, ...] = RUN_PARAMS) -> None:
    """Refuse any key of `params` that is not in `declared`, naming it."""
    extra = sorted(str(k) for k in params if k not in declared)
    if extra:
        raise UndeclaredParamError(
            f"conf key {extra[0]!r} is not a parameter of this DAG (undeclared: {extra}); declared: {list(declared)}"
        )


def conf_of(spec: RunSpec) -> dict[str, Any]:
    """The declared params of `spec` (what a relaunch hands to training_run): nothing the form hides."""
    params = spec.to_params()
    return {k: params[k] for k in RUN_PARAMS if k in params}


def run_root() -> str:
    """LONGRUN_RUN_ROOT, or the default root when this user owns it alone (longrun.runroot)."""
    return runroot.run_root()


def spec_from_params(params: Mapping[str, Any]) -> RunSpec:
    """The RunSpec of a training_run DAG run (its Params minus the attach fields); undeclared keys are refused."""
    check_declared(params)
    return RunSpec.from_params({k: v for k, v in params.items() if k not in ATTACH_PARAMS})


def run_dir(spec: RunSpec) -> str:
    return run_dir_for(spec, run_root())


def fault_state_dir(spec: RunSpec) -> str:
    """Where the trainer keeps drill state (sick-node markers): <run dir>/fault-state, its default."""
    return os.environ.get("LONGRUN_FAULT_STATE_DIR") or os.path.join(run_dir(spec), "fault-state")


def make_job(spec: RunSpec, tag: JobTag) -> JobSpec:
    """The JobSpec of one launch (srun -> NVRx ft_launcher -> the entrypoint), tagged for reattachment,
    run as the job user (LONGRUN_JOB_USER) when one is set."""
    root = run_root()
    user = runroot.job_user()
    runroot.make_missing_root(root, user)
    env = {k: val for k, val in job_store_env().items() if k not in SECRET_STORE_ENV}
    return job_spec_for_run(spec, tag=tag, run_dir_root=root, env=env, python=sys.executable, job_user=user)


def preflight(store: ObjectStore, client: SlurmClient, params: Mapping[str, Any]) -> dict[str, Any]:
    """Check the params, the store and the partition; fail with a message that says what to fix."""
    spec = spec_from_params(params)
    try:
        list(store.list(schema.run_prefix(spec.run_name) + "report.json"))
    except StoreError as e:
        raise RuntimeError(f"the store {store.describe()} is not usable: {e}") from e
    attach = params.get("attach_job_id")
    nodes = client.nodes()
    usable = [n.name for n in nodes if not n.drain_flag and not n.is_down and n.name not in spec.exclude]
    if attach is None and len(usable) < spec.nodes + spec.spare_nodes:
        drained = [f"{n.name} ({n.reason})" for n in nodes if n.drain_flag or n.is_down]
        raise RuntimeError(
            f"run {spec.run_name} needs {spec.nodes + spec.spare_nodes} node(s) in partition {spec.partition}; usable: {usable}"
            f" (drained/down: {drained}; excluded: {list(spec.exclude)})"
        )
    if attach is None and (why := drillcheck.refusal(spec, nodes)):
        raise RuntimeError(f"drill {spec.drill.flag() if spec.drill else None} refused: {why}")
    return {
        "spec": spec.to_params(),
        "attach_job_id": attach,
        "usable_nodes": usable,
        "run_dir": run_dir(spec),
        "drill": spec.drill.flag() if spec.drill else None,
    }


def finish(store: ObjectStore, monitor: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """After a clean end: the final checkpoint validated and promoted, and the run report written.

    The trainer's report.json (with `final_fingerprint`) is kept; longrun adds an `orchestrator` block:
    attempts, incidents, promotions, the Slurm job. A relaunch's incident has its recovery recorded
    before this (longrun.tasks.training_run), so the report lists it."""
    spec = spec_from_params(params)
    run = spec.run_name
    key = schema.store_key(run, schema.REPORT_PATH)
    log = logging.getLogger("longrun.training_run")
    try:
        report = json.loads(store.get_bytes(key))
    except StoreError as e:
        raise RuntimeError(f"run {run} completed but its report {key} is missing: {e}") from e
    final_step = int(report["final_step"])
    promoted = catalog.promoted_steps(store, run)
    gate = None
    if final_step not in promoted and final_step in catalog.checkpoints(store, run).by_step():
        gate = gate_checkpoint(store, run, final_step, log=log)
    view = RunView(store, run)
    incidents = [inc for _key, inc in view.folder(Incident, "incidents/")]
    for problem in view.problems:
        log.warning("run report of %s leaves out %s", run, problem)
    drill = segments.drill_outcome(spec.drill.flag() if spec.drill else None, segments.faults(store, run))
    report["orchestrator"] = {
        "attempt": spec.attempt,
        "job_id": monitor.get("job_id"),
        "promoted_steps": catalog.promoted_steps(store, run),
        "final_gate": gate,
        "incidents": [
            {
                "incident_id": i.incident_id,
                "status": None if i.status is None else str(i.status),  # plain JSON for the XCom
                # the incident's copy of its alert is a free-form object, read tolerantly
                "alert_step": i.alert_ref.step,
                "check": i.alert_ref.check,
                "node": i.attribution.node,
                "lost_steps": i.lost_steps,
                "time_to_recover_s": i.time_to_recover_s,
                "recovery": i.recovery.to_json() if i.recovery else None,
            }
            for i in incidents
        ],
        # every incarnation of the trainer, in order: where it started, how it ended
        "segments": segments.segment_table(segments.segments(store, run)),
        "drill": drill,
        "finished_at": time.time(),
    }
    put_json(store, key, report)
    if drill is not None and not drill["fired"]:
        raise segments.DrillNotFired(
            f"run {run} trained to the end but its drill {drill['drill']} never fired (its target was not"
            " in the run, or the step was never trained): the drill proved nothing"
        )
    return report
