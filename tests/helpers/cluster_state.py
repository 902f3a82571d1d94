"""Bring the test session's Slurm cluster back to clean: every node idle without flags, no reservation, no
active job. Used before and after every test that touches the cluster (tests/slurm/conftest.py).

Unlike `helpers.cleanup.restore_cluster` (which ends only what longrun started, as production code must),
this restores *everything*: the cluster was checked clean before the test, so whatever is there afterwards
was left by the test, whichever backend or admin-like helper made it. It uses Slurm's own commands, not a
backend under test, so a broken backend cannot stop its own clean-up.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from longrun.slurm.cli_backend import CliSlurmClient

SETTLE_S = 60.0  # bounded: a cancelled job is COMPLETING for a moment; a resumed node is idle* for ~1 s
POLL_S = 0.3


def _dirt(client: CliSlurmClient) -> list[str]:
    """What is not clean, in words (empty when clean)."""
    out = []
    for node in client.nodes():
        if node.state != "idle" or node.flags:
            flags = "+".join(sorted(node.flags))
            out.append(f"node {node.name} {node.state}{'+' + flags if flags else ''} reason={node.reason!r}")
    out += [f"reservation {name}" for name in client.reservations()]
    out += [f"active {j.describe()}" for j in client.jobs() if j.is_active]
    return out


def _scontrol(env: dict[str, str], *args: str) -> None:
    # Best effort: "not drained" and "already gone" answers are fine here, the final check decides.
    subprocess.run(["scontrol", *args], env=env, capture_output=True, timeout=30, check=False)


def restore_clean_cluster(cluster: Any) -> list[str]:
    """Restore `cluster` (a helpers.stack_fixtures.SlurmCluster) to clean; what is still dirty after
    SETTLE_S (empty list on success)."""
    env = cluster.client_env()
    client = CliSlurmClient(slurm_conf=cluster.env["SLURM_CONF"])
    deadline = time.monotonic() + SETTLE_S
    if not _dirt(client):
        return []
    for job in client.jobs():
        if job.is_active:
            subprocess.run(
                ["scancel", str(job.job_id)], env=env, capture_output=True, timeout=30, check=False
            )
    for name in client.reservations():
        _scontrol(env, "delete", f"ReservationName={name}")
    repaired: set[str] = set()
    while time.monotonic() < deadline:
        left = _dirt(client)
        if not left:
            return []
        for node in client.nodes():
            if "DRAIN" in node.flags or node.state in ("drained", "draining"):
                _scontrol(env, "update", f"NodeName={node.name}", "State=RESUME")
            elif node.state == "down" and node.name not in repaired:
                # A test killed its slurmd and died before restarting it: start it again (no-op if running).
                repaired.add(node.name)
                cluster.restart_slurmd(node.name)
                _scontrol(env, "update", f"NodeName={node.name}", "State=RESUME")
        time.sleep(POLL_S)
    return _dirt(client)
