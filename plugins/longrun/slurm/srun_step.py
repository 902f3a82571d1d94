"""One command as an srun step on a node: the argument checks, the environment allow-list, cancel on timeout."""

from __future__ import annotations

import signal
import subprocess

from longrun.slurm.errors import InvalidSpecError
from longrun.slurm.models import CommandResult
from longrun.slurm.spec import BASE_EXPORT

#: What a diagnostic step takes from the worker's environment (the probe's knobs; nothing of Airflow's).
#: Not LONGRUN_FAULT_STATE_DIR: the probe would read the runs' fault state (sick-node markers, which jobs
#: write) from it; the state dir reaches a probe only as its `--state-dir`, in an operator's drill
#: (longrun.incident.drill_state).
STEP_EXPORT = (
    *BASE_EXPORT,
    "LONGRUN_PROBE_EXPECT",
    "ATEN_CPU_CAPABILITY",
    "OMP_NUM_THREADS",
)


#: The exit code of a step that ran past its timeout and was cancelled (as timeout(1) says it).
TIMED_OUT = 124


def run_srun(argv: list[str], *, env: dict[str, str], timeout_s: float) -> CommandResult:
    """Run an srun command line; past `timeout_s` cancel its step (exit code TIMED_OUT, said in stderr)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # SIGINT twice within a second is srun's "cancel the step"; then make sure it is gone.
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate(timeout=10)
        return CommandResult(
            exit_code=TIMED_OUT, stdout=out, stderr=err + f"\nlongrun: timed out after {timeout_s} s"
        )
    return CommandResult(exit_code=proc.returncode, stdout=out, stderr=err)


def check_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    """A command for srun: a list of arguments (no shell), the first not an option, none with NUL."""
    if isinstance(argv, str) or not argv:
        raise InvalidSpecError("argv", argv, "must be a non-empty list of arguments")
    cmd = [str(a) for a in argv]
    if cmd[0].startswith("-"):
        raise InvalidSpecError(
            "argv", argv, "the program must not start with '-' (option injection into srun)"
        )
    if any("\0" in a for a in cmd) or len(cmd) > 256 or sum(map(len, cmd)) > 65536:
        raise InvalidSpecError("argv", argv, "has NUL bytes or is absurdly long")
    return cmd
