"""Whether pyslurm can serve this cluster, and importing it without letting libslurm abort this process.

Two hazards shape it:

- libslurm aborts the whole process (it does not raise) when it initialises without a configuration
  source, and pyslurm initialises it at import. So `unavailable_reason` never imports pyslurm here: it
  needs a readable slurm.conf and probes the import in a child process; this process imports it with
  auto-init off and initialises it with an explicit config path (`bind`), once per process.
- libslurm keeps that config for the life of the process: a second client for another cluster in the
  same process is refused instead of silently talking to the first cluster.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from longrun.slurm.errors import BackendUnavailableError

PROBE_TIMEOUT_S = 60.0

_lock = threading.Lock()
_bound_conf: str | None = None  # the slurm.conf libslurm was initialised with in this process


_VERSION = re.compile(r"(\d+)\.(\d+)")


def same_release(a: str, b: str) -> bool:
    """True when two Slurm versions share major.minor (pyslurm is built per Slurm release)."""
    ma, mb = _VERSION.search(a), _VERSION.search(b)
    return bool(ma and mb and ma.groups() == mb.groups())


def _conf_problem(conf: str | None) -> str | None:
    if not conf:
        return (
            "SLURM_CONF is not set: pyslurm is not imported without it (libslurm aborts the process when"
            " it finds no configuration source)"
        )
    if not Path(conf).is_file():
        return f"SLURM_CONF={conf!r} is not a readable file"
    return None


@lru_cache(maxsize=8)
def _probe(conf: str) -> tuple[str | None, str | None]:
    """(pyslurm version, None) or (None, why not): the import and init done in a child process."""
    code = "import sys, pyslurm; pyslurm.slurm_init(sys.argv[1]); sys.stdout.write(str(pyslurm.__version__))"
    env = {**os.environ, "SLURM_CONF": conf, "PYSLURM_DISABLE_AUTO_INIT": "1"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, conf],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"importing pyslurm did not finish within {PROBE_TIMEOUT_S:.0f} s"
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"rc {proc.returncode}"
        return None, f"importing pyslurm failed in a probe process ({how}): {tail}"
    return proc.stdout.strip(), None


def unavailable_reason(*, cluster_version: str | None, slurm_conf: str | None = None) -> str | None:
    """Why pyslurm cannot be used for the cluster of `slurm_conf` (default $SLURM_CONF), or None.

    Never kills the caller: pyslurm is only imported in a child process here.
    """
    conf = slurm_conf or os.environ.get("SLURM_CONF") or None
    if importlib.util.find_spec("pyslurm") is None:
        return "pyslurm is not installed; install the pyslurm release that matches your Slurm (docs/slurm.md)"
    if problem := _conf_problem(conf):
        return problem
    assert conf is not None
    if _bound_conf is not None and _bound_conf != conf:
        return (
            f"pyslurm in this process is bound to {_bound_conf!r}, not {conf!r} (libslurm keeps one config)"
        )
    version, why = _probe(conf)
    if why:
        return why
    if cluster_version and not same_release(version or "", cluster_version):
        return f"pyslurm {version} is built for another Slurm release than the cluster's {cluster_version}"
    return None


def pyslurm_version(slurm_conf: str | None = None) -> str:
    """pyslurm's version, or "" when it cannot be imported safely here."""
    conf = slurm_conf or os.environ.get("SLURM_CONF") or None
    if importlib.util.find_spec("pyslurm") is None or _conf_problem(conf):
        return ""
    assert conf is not None
    return _probe(conf)[0] or ""


def bind(conf: str) -> Any:
    """Import pyslurm and initialise libslurm with `conf`, once per process."""
    global _bound_conf
    with _lock:
        if _bound_conf is not None and _bound_conf != conf:
            raise BackendUnavailableError(
                f"pyslurm in this process is bound to {_bound_conf!r}, not {conf!r}: use one cluster per"
                " process or the CLI backend"
            )
        if _bound_conf is None:
            saved = os.environ.get("PYSLURM_DISABLE_AUTO_INIT")
            os.environ["PYSLURM_DISABLE_AUTO_INIT"] = "1"
            try:
                mod = importlib.import_module("pyslurm")
            finally:
                if saved is None:
                    os.environ.pop("PYSLURM_DISABLE_AUTO_INIT", None)
                else:
                    os.environ["PYSLURM_DISABLE_AUTO_INIT"] = saved
            mod.slurm_init(conf)
            _bound_conf = conf
        return importlib.import_module("pyslurm")
