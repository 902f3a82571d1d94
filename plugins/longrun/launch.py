"""The launch path: a RunSpec becomes the JobSpec whose sbatch script runs the run under NVRx.

Inside the job, the script
1. resolves the rendezvous address from the FIRST node's `NodeAddr` (`scontrol`): on the local cluster
   every node has the same host name, so a host name would not tell the nodes apart;
2. picks the rendezvous port from the job id (two jobs sharing a node do not collide);
3. `srun`s one NVRx `ft_launcher` per node (c10d rendezvous on that address; the first node hosts the
   store), which starts `node_ranks` processes of the run's entrypoint (`--module <name>` or a
   script path, then the entrypoint's own arguments, each quoted; longrun.entrypoint) and restarts them,
   up to `max_restarts` times, when one dies or stops sending heartbeats. longrun's settings reach the
   entrypoint as the LONGRUN_* variables the script exports (`RunSpec.job_env`, the drill, the resume
   point; docs/contracts.md "The job's environment"), never as flags;
4. after `srun` returns, exits 93 if this launch wrote an SDC alert record (the record is the evidence
   the orchestrator reads), else with srun's exit code.

Why step 4: in NVRx 0.4.1 a trainer's ShutdownWorkload request closes the rendezvous, so no agent
restarts anything, but every agent then exits 1, the same code as "restarts used up". The alert record
tells the two apart; `longrun.slurm.outcomes` maps 93 to `sdc_verdict`.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping

from longrun import entrypoint as ep
from longrun import hotspare
from longrun.nvrx_launch import NvrxLaunch
from longrun.runspec import RunSpec
from longrun.slurm import validate as v
from longrun.slurm.errors import InvalidSpecError
from longrun.slurm.spec import BASE_EXPORT, JobSpec, JobTag
from training import ports
from training.config import ENV_FAULTS, ENV_RESUME_FROM

#: The step time the default settings assume for CPU ranks (`gpus_per_node: 0`).
CPU_STEP_S = 0.5
#: The job's environment is an allow-list: these names (by value from the submitting environment, where
#: set) and `env` (written into the script). Store credentials and the alert key are added by name at
#: submit (`longrun.alert_auth.submit_env`); nothing else of the Airflow worker's environment reaches a rank.
#: None of the job environment's LONGRUN_* settings (`longrun.entrypoint.JOB_ENV`, LONGRUN_FAULTS above all)
#: is on it: those come from the script alone.
JOB_EXPORT = (
    *BASE_EXPORT,
    "LONGRUN_FAULT_STATE_DIR",
    "LONGRUN_HANG_S",
    "LONGRUN_FAULTS_EVERY_RESTART",
    "LONGRUN_CODE_VERSION",
    "LONGRUN_INPROCESS_RESTART",
    "ATEN_CPU_CAPABILITY",
    "OMP_NUM_THREADS",
)


def run_dir_for(run: RunSpec, run_dir_root: str) -> str:
    """The run's local record dir: <run_dir_root>/<run name> (one per run, shared by its relaunches)."""
    v.path("run_dir_root", run_dir_root)
    if not run_dir_root.startswith("/"):
        raise InvalidSpecError("run_dir_root", run_dir_root, "must be an absolute path")
    return posixpath.join(run_dir_root.rstrip("/") or "/", run.run_name)


def _launcher_for(python: str) -> str:
    # The console script sits next to the interpreter of the same environment.
    return posixpath.join(posixpath.dirname(python), "ft_launcher") if "/" in python else "ft_launcher"


def _launch_script(
    run: RunSpec, *, run_dir: str, python: str, launcher: str, nvrx: NvrxLaunch, store_flag: str
) -> list[str]:
    """The batch script of a launch without spares: one ft_launcher per node (rendezvous on the first
    node), then the launch's SDC verdict turned into exit 93."""
    q = shlex.quote
    ft_args = [
        f"--nnodes={run.nodes}",
        f"--nproc-per-node={run.node_ranks}",
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
        '--rdzv-id="$SLURM_JOB_ID"',
        f"--max-restarts={run.max_restarts}",
        *nvrx.flags(),
    ]
    # The entrypoint and its own arguments only: longrun's settings travel in the environment below.
    entry = ep.launcher_args(run.entrypoint, run.entrypoint_args)
    once = {ENV_FAULTS: run.drill.flag()} if run.drill else {}  # a relaunch has no drill (RunSpec.relaunch)
    if run.resume_from:
        once[ENV_RESUME_FROM] = run.resume_from
    command = [
        "set -uo pipefail",
        f"RUN_DIR={q(run_dir)}",
        "# The entrypoint's settings (docs/contracts.md, the job's environment): only what this launch sets.",
        f"unset {' '.join(ep.SOMETIMES_ENV)}",
        *ep.export_lines({**run.job_env(run_dir=run_dir), **once}),
        "# Checkpoints and alerts of this launch are those written after this moment (training.nvrx).",
        "export LONGRUN_LAUNCH_T0=$(date +%s)",
        'mkdir -p "$RUN_DIR"',
        "# Every node may share one host name (several slurmd on one host): use the first node's NodeAddr.",
        'FIRST_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "MASTER_ADDR=$(scontrol -o show node \"$FIRST_NODE\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)",
        'if [ -z "$MASTER_ADDR" ]; then echo "longrun: no NodeAddr for $FIRST_NODE" >&2; exit 1; fi',
        f"MASTER_PORT=$(({ports.rendezvous_port_bash(base=nvrx.port_base, span=nvrx.port_span)}))",
        "export MASTER_ADDR MASTER_PORT",
        'echo "longrun: job $SLURM_JOB_ID (slurm restart ${SLURM_RESTART_COUNT:-0}) rendezvous'
        ' $MASTER_ADDR:$MASTER_PORT on $SLURM_JOB_NODELIST"',
        "# One ft_launcher per node; only the first node hosts the rendezvous store (PET_RDZV_CONF is"
        " ft_launcher's --rdzv-conf, set per node).",
        "srun --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c"
        ' \'PET_RDZV_CONF=is_host=$((SLURM_NODEID == 0)) exec "$0" "$@"\' '
        f"{q(launcher)} {' '.join(ft_args)} {entry}",
        "rc=$?",
        f'if {q(python)} -m training.nvrx launch-verdict --run-dir "$RUN_DIR" --run {q(run.run_name)}'
        f' --since "$LONGRUN_LAUNCH_T0"{store_flag}; then',
        '  echo "longrun: SDC verdict in this launch (ft_launcher exit $rc): exit 93"',
        "  exit 93",
        "fi",
        'echo "longrun: ft_launcher exit $rc"',
        'exit "$rc"',
    ]
    return command


def job_spec_for_run(
    run: RunSpec,
    *,
    tag: JobTag,
    run_dir_root: str,
    env: Mapping[str, str],
    nvrx: NvrxLaunch | None = None,
    python: str = "python",
    job_user: str | None = None,
) -> JobSpec:
    """The JobSpec of one launch of `run` (render it with `longrun.slurm.render.render_sbatch`).

    `env` is exported by the script (store endpoint, bucket: no secrets, the script is readable through
    Slurm); the rest of the job's environment is `JOB_EXPORT` plus the secrets given at submit. `python` is the
    interpreter of the environment that has longrun's job side and NVRx (its `ft_launcher` is used);
    the run's `job_python`, when set, wins. `nvrx` defaults to `NvrxLaunch()` for GPU runs and
    `NvrxLaunch.for_step_time(CPU_STEP_S)` for CPU runs. `job_user`: the Unix user the job runs as
    (`JobSpec.run_as`; None: the submitter), who must write `run_dir_root` and run `python`."""
    if nvrx is None:
        # CPU ranks run the small presets (sub-second steps): detect a hang in seconds, not minutes.
        nvrx = NvrxLaunch() if run.gpus_per_node else NvrxLaunch.for_step_time(CPU_STEP_S)
    python = run.job_python or python
    v.path("python", python)
    for where, names in (("env", env), ("extra_env", run.extra_env)):
        if reserved := sorted(set(names) & set(ep.JOB_ENV)):
            raise InvalidSpecError(
                where, reserved, "the job environment's LONGRUN_* settings come from the run"
            )
    run_dir = run_dir_for(run, run_dir_root)
    launcher = _launcher_for(python)
    store = " --store" if env.get("AWS_ENDPOINT_URL") or env.get("LONGRUN_STORE_DIR") else ""
    command = _launch_script(
        run, run_dir=run_dir, python=python, launcher=launcher, nvrx=nvrx, store_flag=store
    )
    if run.spare_nodes:  # the job keeps its allocation after an SDC verdict (longrun.hotspare)
        command = hotspare.supervised_command(
            run, run_dir=run_dir, python=python, launcher=launcher, nvrx=nvrx, store_flag=store
        )
    gpu = run.gpus_per_node > 0
    return JobSpec(
        name=run.run_name,
        partition=run.partition,
        command=tuple(command),
        comment=tag.render(),
        nodes=run.nodes + run.spare_nodes,
        ntasks_per_node=1,
        gpus_per_node=run.gpus_per_node,
        # CPU ranks share nodes with diagnostics; GPU jobs own their nodes.
        exclusive=gpu,
        time_limit_min=run.time_limit_min,
        exclude=run.exclude,
        # A drill that names a node must land on it (longrun.drillcheck): pin it into the allocation.
        nodelist=(run.drill.node,) if run.drill and run.drill.node else (),
        # sbatch opens these before the script runs, so they must already exist: the root does.
        workdir=run_dir_root,
        output=f"{run_dir}.slurm-%j.out",
        env={**dict(run.extra_env), **dict(env), **nvrx.worker_env()},
        export=JOB_EXPORT,
        run_as=job_user,
    )
