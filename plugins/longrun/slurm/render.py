"""One pure function: JobSpec -> sbatch script text.

Pure so it can be tested against a golden file and so a dry run shows exactly what would be submitted.
"""

from __future__ import annotations

import shlex

from longrun.slurm.spec import JobSpec


def _time(minutes: int) -> str:
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00"


def render_sbatch(spec: JobSpec) -> str:
    """The batch script for `spec`, directives first, then exported env, then the command lines."""
    d = [
        f"--job-name={spec.name}",
        f"--partition={spec.partition}",
        f"--nodes={spec.nodes}",
        f"--ntasks-per-node={spec.ntasks_per_node}",
    ]
    if spec.gpus_per_node:
        d.append(f"--gres=gpu:{spec.gpu_type}:{spec.gpus_per_node}")
    if spec.exclusive:
        d.append("--exclusive")
    d.append(f"--time={_time(spec.time_limit_min)}")
    # Append, never truncate: a requeued job keeps the log of its earlier runs.
    d.append("--open-mode=append")
    # Explicit either way: the cluster default (JobRequeue) differs between sites.
    d.append("--requeue" if spec.requeue else "--no-requeue")
    d.append(f"--comment={spec.comment}")
    # An allow-list, not sbatch's default (ALL): the Airflow worker's environment stays behind.
    d.append(f"--export={','.join(spec.export)}")
    if spec.exclude:
        d.append(f"--exclude={','.join(spec.exclude)}")
    if spec.nodelist:
        d.append(f"--nodelist={','.join(spec.nodelist)}")
    if spec.reservation:
        d.append(f"--reservation={spec.reservation}")
    if spec.workdir:
        d.append(f"--chdir={spec.workdir}")
    if spec.output:
        d.append(f"--output={spec.output}")
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {x}" for x in d]
    # Values are already allow-listed; quoting is a second fence, not the only one.
    lines += [f"export {k}={shlex.quote(val)}" for k, val in sorted(spec.env.items())]
    # sbatch hands its --export list to every srun in the job (SLURM_EXPORT_ENV): without this, a step
    # would see only those names, not what the script exported. The job's environment is allow-listed
    # already, so a step takes all of it.
    lines.append("export SLURM_EXPORT_ENV=ALL")
    lines += list(spec.command)
    return "\n".join(lines) + "\n"
