"""Bring the test session's Slurm cluster back to clean: every node idle without flags, no reservation, no
active job. Used before and after every test that touches the cluster (tests/slurm/conftest.py).
Every other test that uses the cluster is held to less (tests/conftest.py, `slurm_restored`): whatever it
added (a job, a reservation, a drained or downed node, a killed slurmd) is undone afterwards, even on
failure (`snapshot`, `restore_snapshot`), so that no later test starts on what it left.

Unlike `helpers.cleanup.restore_cluster` (which ends only what longrun started, as production code must),
this restores *everything*: the cluster was checked clean before the test, so whatever is there afterwards
was left by the test, whichever backend or admin-like helper made it. It uses Slurm's own commands, not a
backend under test, so a broken backend cannot stop its own clean-up.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a test may change on the session's cluster, as it was before the test."""

    jobs: frozenset[int]  # active
    reservations: frozenset[str]
    drained: frozenset[str]  # drained or draining
    down: frozenset[str]
    slurmd: frozenset[str]  # nodes whose slurmd runs


def snapshot(cluster: Any) -> Snapshot:
    client = CliSlurmClient(slurm_conf=cluster.env["SLURM_CONF"])
    nodes = client.nodes()
    return Snapshot(
        jobs=frozenset(j.job_id for j in client.jobs() if j.is_active),
        reservations=frozenset(client.reservations()),
        drained=frozenset(n.name for n in nodes if n.drain_flag),
        down=frozenset(n.name for n in nodes if n.is_down),
        slurmd=frozenset(n for n in cluster.nodes if cluster.stack.slurm.live_record(f"slurmd-{n}")),
    )


def _added(cluster: Any, client: CliSlurmClient, before: Snapshot) -> list[str]:
    """What the cluster has now that it did not have in `before`, in words (empty when nothing)."""
    out = [f"slurmd of {n} not running" for n in sorted(before.slurmd) if not cluster.stack.slurm.live_record(f"slurmd-{n}")]  # fmt: skip
    out += [f"active {j.describe()}" for j in client.jobs() if j.is_active and j.job_id not in before.jobs]
    out += [f"reservation {r}" for r in client.reservations() if r not in before.reservations]
    for n in client.nodes():
        if (n.drain_flag and n.name not in before.drained) or (n.is_down and n.name not in before.down):
            out.append(f"node {n.name} {n.state}+{'+'.join(sorted(n.flags))} reason={n.reason!r}")
    return out


def restore_snapshot(cluster: Any, before: Snapshot) -> list[str]:
    """Undo what a test added to the cluster since `before`, whoever made it: restart the slurmd it killed,
    cancel the jobs it left active, delete its reservations, resume the nodes it drained or took down.
    State that was there before is left alone (a module's fixture may hold a job across its tests).
    Returns what is still added after SETTLE_S (empty on success)."""
    env = cluster.client_env()
    client = CliSlurmClient(slurm_conf=cluster.env["SLURM_CONF"])
    if not _added(cluster, client, before):
        return []
    for node in sorted(before.slurmd):
        cluster.restart_slurmd(node)  # a no-op where it runs
    for job in client.jobs():
        if job.is_active and job.job_id not in before.jobs:
            subprocess.run(
                ["scancel", str(job.job_id)], env=env, capture_output=True, timeout=30, check=False
            )
    for name in client.reservations():
        if name not in before.reservations:
            _scontrol(env, "delete", f"ReservationName={name}")
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        left = _added(cluster, client, before)
        if not left:
            return []
        for node in client.nodes():
            if (node.drain_flag and node.name not in before.drained) or (
                node.is_down and node.name not in before.down
            ):
                _scontrol(env, "update", f"NodeName={node.name}", "State=RESUME")
        time.sleep(POLL_S)
    return _added(cluster, client, before)


def clean_snapshot(cluster: Any) -> Snapshot:
    """A clean cluster as a snapshot: no active job, no reservation, every node up with its slurmd running."""
    none: frozenset[Any] = frozenset()
    return Snapshot(jobs=none, reservations=none, drained=none, down=none, slurmd=frozenset(cluster.nodes))


def restore_clean_cluster(cluster: Any) -> list[str]:
    """Restore `cluster` (a helpers.stack_fixtures.SlurmCluster) to clean: `restore_snapshot` from the clean
    snapshot, then wait (bounded) until no node shows any state or flag but idle. What is still dirty after
    that (empty list on success)."""
    client = CliSlurmClient(slurm_conf=cluster.env["SLURM_CONF"])
    if not _dirt(client):
        return []
    if left := restore_snapshot(cluster, clean_snapshot(cluster)):
        return left
    deadline = time.monotonic() + SETTLE_S
    while (left := _dirt(client)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return left
