"""Picking the backend that serves this cluster: the one module that knows every backend.

The backends import the interface (`client`) and the values (`models`), never this module, so choosing a
backend adds no import cycle; pyslurm itself is imported only once it is known to be usable
(`pyslurm_loader`).
"""

from __future__ import annotations

import os

from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import BackendUnavailableError


def make_client(*, backend: str = "auto", slurm_conf: str | None = None) -> SlurmClient:
    """The client for this cluster.

    `backend`: "cli", "pyslurm", or "auto" (pyslurm when it imports and its version matches the cluster's,
    else the CLI). `slurm_conf` defaults to $SLURM_CONF. Raises BackendUnavailableError for another
    backend name, or for "pyslurm" where pyslurm cannot serve this cluster (the message says why).
    """
    conf = slurm_conf or os.environ.get("SLURM_CONF") or None
    if backend not in ("auto", "cli", "pyslurm"):
        raise BackendUnavailableError(f"backend={backend!r}: expected 'auto', 'cli' or 'pyslurm'")
    if backend == "cli":
        return CliSlurmClient(slurm_conf=conf)
    from longrun.slurm import pyslurm_backend, pyslurm_loader

    cli = CliSlurmClient(slurm_conf=conf)
    reason = pyslurm_loader.unavailable_reason(cluster_version=cli.version(), slurm_conf=conf)
    if reason is None:
        return pyslurm_backend.PyslurmClient(slurm_conf=conf)
    if backend == "pyslurm":
        raise BackendUnavailableError(f"backend='pyslurm': {reason}")
    return cli
