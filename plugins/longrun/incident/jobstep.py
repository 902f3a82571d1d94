"""Commands inside a running job's allocation, from outside it (the orchestrator): a one-task step on a
node the job holds (`srun --jobid`), and the job's batch host.

srun must be run by the job's user, root or a Slurm operator. A step on a node where another step of the
job runs needs `--overlap` (else "Requested nodes are busy"); a step on a node that is then released
from the job is killed (measured on Slurm 22.05: exit 137).
"""

from __future__ import annotations

import os
import subprocess

from longrun.slurm import validate as v
from longrun.slurm.client import CommandResult, SlurmClient
from longrun.slurm.srun_step import STEP_EXPORT, run_srun

#: srun's name for the diagnostic steps inside a job (squeue -s shows it beside the training steps).
STEP_NAME = "longrun-diag-step"


def _env(client: SlurmClient) -> dict[str, str]:
    # Inherited SLURM_* (an enclosing allocation) would redirect srun: keep only the configuration.
    env = {k: val for k, val in os.environ.items() if not k.startswith("SLURM_")}
    if conf := getattr(client, "slurm_conf", None):
        env["SLURM_CONF"] = str(conf)
    return env


def run_step(
    client: SlurmClient,
    job_id: int,
    node: str,
    argv: tuple[str, ...],
    *,
    timeout_s: float,
    overlap: bool = False,
) -> CommandResult:
    """Run `argv` as a one-task step of job `job_id` on `node` (which the job must hold)."""
    v.node("node", node)
    cmd = [str(a) for a in argv]
    if not cmd or cmd[0].startswith("-") or any("\0" in a for a in cmd):
        raise ValueError(f"argv={argv!r}: a program first (no option injection into srun), no NUL bytes")
    full = [
        "srun",
        f"--jobid={int(job_id)}",
        f"--nodelist={node}",
        "--nodes=1",
        "--ntasks=1",
        f"--job-name={STEP_NAME}",
        f"--time={max(1, int(timeout_s // 60) + 1)}",
        # the same allow-list as the reservation path: the worker's environment (secrets) stays here
        f"--export={','.join(STEP_EXPORT)}",
        *(["--overlap"] if overlap else []),
        *cmd,
    ]
    return run_srun(full, env=_env(client), timeout_s=timeout_s)


def batch_host(client: SlurmClient, job_id: int) -> str | None:
    """The node that runs the job's batch script (the supervisor): never released from the job."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", str(int(job_id))],
        env=_env(client),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    for part in out.stdout.split():
        if part.startswith("BatchHost="):
            return part.split("=", 1)[1] or None
    return None


def job_steps(client: SlurmClient, job_id: int) -> list[tuple[str, str]]:
    """(step id, step name) of every step the job runs now, as `squeue -s` lists them. RuntimeError when
    squeue fails: then nothing can be said about the job's steps."""
    out = subprocess.run(
        ["squeue", "-h", "-s", "-j", str(int(job_id)), "-o", "%i %j"],
        env=_env(client),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"squeue -s -j {int(job_id)} failed: {out.stderr.strip() or out.stdout.strip()}")
    return [
        (parts[0], parts[1] if len(parts) > 1 else "")
        for parts in (line.split(None, 1) for line in out.stdout.splitlines())
        if parts
    ]
