"""The batch script of a run with hot spares: the job holds `nodes + spare_nodes` and a supervisor
(training.spares.supervisor) runs each training step on `nodes` of them.

One step is what a plain launch does (srun -> one NVRx ft_launcher per node -> the trainer, then exit 93
if the step wrote an SDC alert), on the step's own nodes (LONGRUN_STEP_NODES), with a rendezvous of
its own (id and port per attempt), the drill (LONGRUN_FAULTS) only on attempt 0, and LONGRUN_RESUME_FROM
from the directive, which the supervisor sets (a standby gets LONGRUN_AWAIT_DIRECTIVE_S instead, from the
supervisor's LONGRUN_STANDBY_WAIT_S); the step is named after its attempt (training.spares.directive.ATTEMPT_STEP_PREFIX). Once the step's alert is in
the store the supervisor starts the next step as a warm standby on the predicted nodes (`--overlap`:
the alerting step may still be ending there; its trainer waits for the directive: training.spares.standby).
After exit 93 it waits (bounded: LONGRUN_DIRECTIVE_WAIT_S, default `DIRECTIVE_WAIT_S`; with
LONGRUN_STANDBY_AT=verdict the standby starts only after the step's end; both from the job spec's `env`,
since sbatch passes only an allow-list of the submitter's environment) for `sdc_incident`'s directive
and lets the standby train, or stops it and runs the directed step; without a directive it exits 93,
and the incident falls back to the full relaunch.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from longrun import entrypoint as ep
from training import ports
from training.config import ENV_AWAIT_DIRECTIVE_S, ENV_FAULTS, ENV_RESUME_FROM
from training.spares.directive import ATTEMPT_STEP_PREFIX

if TYPE_CHECKING:
    from longrun.nvrx_launch import NvrxLaunch
    from longrun.runspec import RunSpec

#: Longest wait for a directive after an SDC verdict: attribution, the drain and the pick must fit in it
#: (the diagnosis runs beside them, as a step of this job: longrun.incident.hot_spare); after it the job
#: ends with 93 and the full relaunch takes over.
DIRECTIVE_WAIT_S = 300
#: Attempt a of job j rendezvous on base + (j + a * span // 2) mod span (training.ports, the one rule):
#: attempt 0 on the plain launch's port (longrun.launch), the next half a span away, every attempt inside
#: [base, base + span - 1] (23500-30999 by default: below the ephemeral range, clear of the local stack).
#: A multiplied job id landed anywhere: an attempt drew the local S3 server's port.


def attempt_port_expr(nvrx: NvrxLaunch) -> str:
    """The bash arithmetic for an attempt's rendezvous port (see above)."""
    return ports.rendezvous_port_bash(base=nvrx.port_base, span=nvrx.port_span, attempt_var="LONGRUN_ATTEMPT")


def step_script(
    run: RunSpec, *, run_dir: str, python: str, launcher: str, nvrx: NvrxLaunch, store_flag: str
) -> str:
    """One training step as a one-line bash script (the supervisor's `--step`)."""
    q = shlex.quote
    # The entrypoint and its own arguments only: longrun's settings travel in the environment.
    entry = ep.launcher_args(run.entrypoint, run.entrypoint_args)
    ft_args = [
        f"--nnodes={run.nodes}",
        f"--nproc-per-node={run.node_ranks}",
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
        '--rdzv-id="$SLURM_JOB_ID-a$LONGRUN_ATTEMPT"',
        f"--max-restarts={run.max_restarts}",
        *nvrx.flags(),
    ]
    # the drill fires in the first attempt only; a relaunch resumes from the directed checkpoint
    fault = (
        f'if [ "$LONGRUN_ATTEMPT" = 0 ]; then export {ENV_FAULTS}={q(run.drill.flag())}; fi'
        if run.drill
        else ""
    )
    lines = [
        # to the nanosecond: a standby starts within a second of the previous attempt's alert, which is
        # not this attempt's (the verdict below and an NVRx restart's resume count only records since T0)
        "export LONGRUN_LAUNCH_T0=$(date +%s.%N)",
        "FIRST_NODE=${LONGRUN_STEP_NODES%%,*}",
        "MASTER_ADDR=$(scontrol -o show node \"$FIRST_NODE\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)",
        'if [ -z "$MASTER_ADDR" ]; then echo "longrun: no NodeAddr for $FIRST_NODE" >&2; exit 1; fi',
        f"MASTER_PORT=$(({attempt_port_expr(nvrx)}))",
        "export MASTER_ADDR MASTER_PORT",
        # the entrypoint's settings (docs/contracts.md, the job's environment); the supervisor sets
        # LONGRUN_RESUME_FROM for each attempt (empty: from scratch, so unset here)
        f"unset {' '.join(n for n in ep.SOMETIMES_ENV if n != ENV_RESUME_FROM)}",
        *ep.export_lines(run.job_env(run_dir=run_dir)),
        *([fault] if fault else []),
        f'if [ -z "${{{ENV_RESUME_FROM}:-}}" ]; then unset {ENV_RESUME_FROM}; fi',
        # a warm standby: the entrypoint waits for this attempt's directive (training.spares.standby) and resumes
        # from it, never from LONGRUN_RESUME_FROM; it starts while the previous attempt's step may still be
        # ending on the same nodes, so its step overlaps that one
        "OVERLAP=()",
        'if [ -n "${LONGRUN_STANDBY_WAIT_S:-}" ]; then'
        f' export {ENV_AWAIT_DIRECTIVE_S}="$LONGRUN_STANDBY_WAIT_S"; unset {ENV_RESUME_FROM}; OVERLAP=(--overlap); fi',
        'echo "longrun: attempt $LONGRUN_ATTEMPT of job $SLURM_JOB_ID on $LONGRUN_STEP_NODES'
        ' rendezvous $MASTER_ADDR:$MASTER_PORT"',
        'srun --export=ALL --nodes="$LONGRUN_STEP_NNODES" --ntasks="$LONGRUN_STEP_NNODES" --nodelist="$LONGRUN_STEP_NODES"'
        f' --ntasks-per-node=1 --job-name="{ATTEMPT_STEP_PREFIX}$LONGRUN_ATTEMPT" "${{OVERLAP[@]}}"'
        " --kill-on-bad-exit=0 bash -c"
        ' \'PET_RDZV_CONF=is_host=$((SLURM_NODEID == 0)) exec "$0" "$@"\' '
        f"{q(launcher)} {' '.join(ft_args)} {entry}",
        "rc=$?",
        f"if {q(python)} -m training.nvrx launch-verdict --run-dir {q(run_dir)} --run {q(run.run_name)}"
        f' --since "$LONGRUN_LAUNCH_T0"{store_flag}; then'
        ' echo "longrun: SDC verdict in attempt $LONGRUN_ATTEMPT (ft_launcher exit $rc): exit 93"; exit 93; fi',
        'exit "$rc"',
    ]
    return "; ".join(lines)


def supervised_command(
    run: RunSpec, *, run_dir: str, python: str, launcher: str, nvrx: NvrxLaunch, store_flag: str
) -> list[str]:
    """The batch script's lines: the supervisor, which runs `step_script` once per attempt."""
    q = shlex.quote
    step = step_script(
        run, run_dir=run_dir, python=python, launcher=launcher, nvrx=nvrx, store_flag=store_flag
    )
    resume = f" --resume-from {q(run.resume_from)}" if run.resume_from else ""
    if run.drill and run.drill.node:  # the drill's node trains in the first attempt
        resume += f" --include {q(run.drill.node)}"
    return [
        "set -uo pipefail",
        f"mkdir -p {q(run_dir)}",
        f'echo "longrun: job $SLURM_JOB_ID holds $SLURM_JOB_NODELIST: {run.nodes} training + '
        f'{run.spare_nodes} spare node(s)"',
        f"exec {q(python)} -m training.spares.supervisor --run-name {q(run.run_name)} --width {run.nodes}"
        f' --spares {run.spare_nodes} --wait-s "${{LONGRUN_DIRECTIVE_WAIT_S:-{DIRECTIVE_WAIT_S}}}"'
        f' --standby-at "${{LONGRUN_STANDBY_AT:-alert}}"{resume}'
        f" --step {q(step)}",
    ]
