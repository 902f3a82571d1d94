"""Provider registration and backend choice."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
from helpers.pyslurm_required import skip_without_pyslurm
from longrun.provider import get_provider_info
from longrun.slurm import pyslurm_loader
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.errors import BackendUnavailableError
from longrun.slurm.factory import make_client
from longrun.slurm.pyslurm_backend import PyslurmClient
from longrun.slurm.pyslurm_loader import same_release


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
def test_auto_picks_pyslurm_where_usable_else_the_cli_and_says_why(slurm_cluster):
    conf = slurm_cluster.env["SLURM_CONF"]
    reason = pyslurm_loader.unavailable_reason(
        cluster_version=CliSlurmClient(slurm_conf=conf).version(), slurm_conf=conf
    )
    client = make_client(backend="auto", slurm_conf=conf)
    if reason is None:
        assert isinstance(client, PyslurmClient) and client.backend == "pyslurm"
        return
    assert isinstance(client, CliSlurmClient) and client.backend == "cli"
    with pytest.raises(BackendUnavailableError, match="pyslurm"):
        make_client(backend="pyslurm", slurm_conf=conf)


# The attack: a worker decides which backend to use in a process that has no SLURM_CONF (or a broken
# one). libslurm aborts the whole process there (it does not raise), so the check must never import
# pyslurm in the caller. Run in a child so that, without the defence, the abort shows as its exit status.
_CHECK = """
import sys
from longrun.slurm import pyslurm_backend, pyslurm_loader  # the backend module must be as safe to import
reason = pyslurm_loader.unavailable_reason(cluster_version=None, slurm_conf=sys.argv[1] or None)
print("REASON:", reason)
"""


def _check_in_child(conf: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CHECK, conf], env=env, capture_output=True, text=True, timeout=120
    )


def test_availability_check_without_slurm_conf_says_why_and_the_caller_survives():
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    proc = _check_in_child("", env)
    assert proc.returncode == 0, f"the caller died (rc {proc.returncode}): {proc.stderr[-500:]}"
    reason = proc.stdout.split("REASON:", 1)[1].strip()
    assert reason != "None"
    assert "SLURM_CONF" in reason or "not installed" in reason


def test_availability_check_with_a_broken_slurm_conf_survives(tmp_path):
    """A conf libslurm cannot use (empty: no ClusterName, no controller) must not kill the caller either."""
    if importlib.util.find_spec("pyslurm") is None:
        skip_without_pyslurm("pyslurm is not installed: nothing could abort (the 25.11 tier runs this)")
    broken = tmp_path / "slurm.conf"
    broken.write_text("# nothing useful\n")
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    proc = _check_in_child(str(broken), env)
    assert proc.returncode == 0, f"the caller died (rc {proc.returncode}): {proc.stderr[-500:]}"
    assert "probe process" in proc.stdout


@pytest.mark.slurm
def test_one_process_one_cluster_for_pyslurm(slurm_cluster, tmp_path):
    """libslurm keeps the config it was initialised with: a client for another cluster is refused, not
    silently pointed at the first one."""
    conf = slurm_cluster.env["SLURM_CONF"]
    if pyslurm_loader.unavailable_reason(cluster_version=None, slurm_conf=conf):
        skip_without_pyslurm("pyslurm is not usable here (the 25.11 tier runs this)")
    PyslurmClient(slurm_conf=conf)
    other = tmp_path / "slurm.conf"
    shutil.copy(conf, other)
    assert "bound to" in (
        pyslurm_loader.unavailable_reason(cluster_version=None, slurm_conf=str(other)) or ""
    )
    with pytest.raises(BackendUnavailableError, match="bound to"):
        PyslurmClient(slurm_conf=str(other))
