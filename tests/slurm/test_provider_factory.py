"""Provider registration and backend choice."""

from __future__ import annotations

import importlib

import pytest
from longrun.provider import get_provider_info
from longrun.slurm import pyslurm_backend
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.client import make_client, same_release
from longrun.slurm.errors import BackendUnavailableError


def test_provider_registers_the_slurm_connection_type_with_an_importable_hook():
    info = get_provider_info()
    (conn,) = info["connection-types"]
    assert conn["connection-type"] == "slurm"
    module, _, name = conn["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(module), name)
    assert hook.conn_type == "slurm" and hook.default_conn_name == "slurm_default"
    for kind in ("hooks", "operators", "sensors", "triggers"):
        for entry in info[kind]:
            for mod in entry["python-modules"]:
                importlib.import_module(mod)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [("25.11.2", "slurm 25.11.0", True), ("25.11.2", "22.05.8", False), ("", "22.05.8", False)],
)
def test_same_release(a, b, same):
    assert same_release(a, b) is same


def test_unknown_backend_is_refused():
    with pytest.raises(BackendUnavailableError, match="expected"):
        make_client(backend="slurmrestd")


@pytest.mark.slurm
def test_auto_picks_the_cli_here_and_pyslurm_says_why_not(slurm_cluster):
    conf = slurm_cluster.env["SLURM_CONF"]
    reason = pyslurm_backend.unavailable_reason(cluster_version=CliSlurmClient(slurm_conf=conf).version())
    client = make_client(backend="auto", slurm_conf=conf)
    if reason is None:
        pytest.skip("pyslurm is usable here: auto picks it (covered by the contract tests)")
    assert isinstance(client, CliSlurmClient) and client.backend == "cli"
    with pytest.raises(BackendUnavailableError, match="pyslurm"):
        make_client(backend="pyslurm", slurm_conf=conf)
