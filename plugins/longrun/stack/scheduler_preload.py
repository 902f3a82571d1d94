"""Airflow local settings for the local stack: the scheduler imports torch once, before it forks.

When the layout's `preload_torch` is on, `longrun stack up` copies this file to
`$AIRFLOW_HOME/config/airflow_local_settings.py`. Airflow puts `$AIRFLOW_HOME/config` on `sys.path` and
imports `airflow_local_settings` once at the start of every Airflow process (the documented place for
site customisation): api-server, scheduler, dag-processor, triggerer, and any `airflow` command run with
this AIRFLOW_HOME. Only a process started with `LONGRUN_AIRFLOW_PRELOAD` in its environment imports
anything here, and the stack sets that variable for the scheduler only. The variable is taken out of the
environment at once, so the commands the scheduler's tasks start (`airflow`, Python) do not pay for it.

Why the scheduler: with LocalExecutor on Linux the scheduler forks its worker processes
(multiprocessing's `fork` start method, Airflow's default there) and, for each task, the task SDK's
supervisor in a worker forks the task process without an exec (`airflow.sdk.execution_time.supervisor`,
`WatchedSubprocess.start`). A module the scheduler imported before that is already imported in every
task: a task that validates checkpoints does not import torch again (10-12 s on two busy cores).

Fork safety: the import happens here, in the main thread, before Airflow starts any thread or worker.
Importing torch starts no thread of torch's own and initialises none of its thread pools. numpy, which
torch imports, loads OpenBLAS, whose thread pool starts at load time: it is loaded with
`OPENBLAS_NUM_THREADS=1` (unless the environment sets it) so that the scheduler stays one thread; the
variable is removed again afterwards, so it reaches no child that execs. In the forked tasks numpy's
BLAS is then single-threaded (torch's own CPU kernels do not use it).
"""

from __future__ import annotations

import importlib
import os

__all__: list[str] = []  # Airflow copies a local settings module's public names into airflow.settings

PRELOAD_ENV = "LONGRUN_AIRFLOW_PRELOAD"
"""Comma-separated modules to import at the start of the process that has it (the stack's scheduler)."""


def preload() -> list[str]:
    """Import the modules `$LONGRUN_AIRFLOW_PRELOAD` names and remove that variable; the modules imported."""
    environ = os.environ
    wanted = [m.strip() for m in environ.pop(PRELOAD_ENV, "").split(",") if m.strip()]
    if not wanted:
        return []
    blas_set_here = "OPENBLAS_NUM_THREADS" not in environ
    if blas_set_here:
        environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        for name in wanted:
            importlib.import_module(name)
    finally:
        if blas_set_here:
            environ.pop("OPENBLAS_NUM_THREADS", None)
    return wanted


preload()
