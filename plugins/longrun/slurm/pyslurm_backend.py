"""The pyslurm backend: Slurm's C API through pyslurm, where it is installed and built for this cluster.

pyslurm is imported lazily (only when this backend is chosen): PyPI has it for Slurm 25.11 only, and it
does not build against Debian 12's Slurm 22.05, so on the local stack the CLI backend runs and
this one is skipped with its reason. Quirks handled (pyslurm 25.11.2): `time_limit` must be an
int or "HH:MM:SS"; the version is `pyslurm.__version__`; nodes are `Job.allocated_nodes`; right after
RESUME a node reads IDLE+NOT_RESPONDING for ~1 s and keeps its old reason text.

pyslurm has no call for MAINT reservations with `ignore_jobs` nor for an interactive step; those two go
through the CLI backend, which this class holds. Written against pyslurm 25.11's documented API and NOT
exercised here (no Slurm 25.11 on this machine).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from longrun.slurm import parse
from longrun.slurm import validate as v
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.client import CommandResult, JobState, NodeState, fold_status, same_release
from longrun.slurm.errors import (
    BackendUnavailableError,
    ForeignDrainError,
    SubmitRejectedError,
)
from longrun.slurm.render import render_sbatch
from longrun.slurm.spec import JobSpec


def _import() -> Any:
    return importlib.import_module("pyslurm")


def pyslurm_version() -> str:
    try:
        return str(_import().__version__)
    except ImportError:
        return ""


def unavailable_reason(*, cluster_version: str | None) -> str | None:
    """Why pyslurm cannot be used here, or None when it can."""
    try:
        mod = _import()
    except ImportError as err:
        return f"pyslurm does not import ({err}); install the pyslurm release that matches your Slurm"
    version = str(getattr(mod, "__version__", ""))
    if cluster_version and not same_release(version, cluster_version):
        return f"pyslurm {version} is built for another Slurm release than the cluster's {cluster_version}"
    return None


class PyslurmClient:
    """SlurmClient over pyslurm; reservations and srun steps delegate to the CLI backend."""

    backend = "pyslurm"

    def __init__(self, *, slurm_conf: str | None = None) -> None:
        if slurm_conf:
            # libslurm reads SLURM_CONF when it initialises, i.e. at import: set it first.
            os.environ.setdefault("SLURM_CONF", slurm_conf)
        reason = unavailable_reason(cluster_version=None)
        if reason:
            raise BackendUnavailableError(reason)
        self._ps = _import()
        self._cli = CliSlurmClient(slurm_conf=slurm_conf)

    def version(self) -> str:
        return self._cli.version()

    def submit(self, spec: JobSpec) -> int:
        desc = self._ps.JobSubmitDescription(script=render_sbatch(spec), environment=dict(os.environ))
        desc.load_sbatch_options()  # the #SBATCH lines are the single source of the job's options
        try:
            return int(desc.submit())
        except self._ps.RPCError as err:
            raise SubmitRejectedError(f"pyslurm refused job {spec.name!r}: {err}") from err

    def _state(self, job: Any) -> JobState:
        raw = str(job.state).upper()
        restarts = int(job.requeue_count or 0)
        exit_code = getattr(job, "exit_code", None)
        signal = getattr(job, "exit_code_signal", None) or None
        reason = job.state_reason
        return JobState(
            job_id=int(job.id),
            status=fold_status(raw, restart_count=restarts),
            slurm_state=raw,
            exit_code=None if signal else exit_code,
            signal=signal,
            restart_count=restarts,
            nodes=parse.expand_hostlist(getattr(job, "allocated_nodes", None) or getattr(job, "nodes", None)),
            reason=None if reason in (None, "None") else str(reason),
            name=str(job.name or ""),
            comment=str(getattr(job, "comment", "") or ""),
            held=raw == "PENDING" and bool(reason and "held" in str(reason).lower()),
            source="pyslurm",
        )

    def job(self, job_id: int) -> JobState:
        v.int_range("job_id", job_id, 1, 2**32)
        try:
            return self._state(self._ps.Job.load(job_id))
        except self._ps.RPCError:
            return self._cli.job(job_id)  # forgotten by slurmctld: the durable jobcomp record

    def jobs(self) -> list[JobState]:
        return [self._state(j) for j in self._ps.Jobs.load().values()]

    def find_jobs(self, tag_prefix: str) -> list[JobState]:
        v.tag("tag_prefix", tag_prefix)
        hits = [j for j in self.jobs() if j.comment.startswith(tag_prefix)]
        return sorted(hits, key=lambda j: j.job_id, reverse=True)

    def cancel(self, job_id: int) -> None:
        self._ps.Job(job_id).cancel()

    def requeue_hold(self, job_id: int) -> None:
        self._ps.Job(job_id).requeue(hold=True)

    def set_excluded(self, job_id: int, nodes: tuple[str, ...]) -> None:
        names = v.nodes("nodes", nodes)
        self._ps.Job(job_id).modify(
            self._ps.JobSubmitDescription(excluded_nodes=list(names), begin_time="now")
        )

    def release(self, job_id: int) -> None:
        self._ps.Job(job_id).release()

    def node(self, name: str) -> NodeState:
        v.node("node", name)
        n = self._ps.Node.load(name)
        base, flags = parse.split_node_state(str(n.state))
        return NodeState(name=name, state=base, flags=flags, reason=parse.strip_reason(n.reason))

    def nodes(self) -> list[NodeState]:
        return [self.node(name) for name in self._ps.Nodes.load()]

    def drain(self, node: str, reason: str) -> None:
        v.node("node", node)
        v.reason("reason", reason, ours=True)
        self._ps.Node.load(node).modify(self._ps.Node(state="DRAIN", reason=reason))

    def resume(self, node: str) -> None:
        state = self.node(node)
        if not state.drain_flag and not state.is_down:
            return
        if not state.is_ours:
            raise ForeignDrainError(f"node {node} is drained with reason {state.reason!r}, not longrun's")
        self._ps.Node.load(node).modify(self._ps.Node(state="RESUME"))

    def create_maint_reservation(self, name: str, nodes: tuple[str, ...], duration_min: int) -> str:
        return self._cli.create_maint_reservation(name, nodes, duration_min)

    def delete_reservation(self, name: str) -> None:
        self._cli.delete_reservation(name)

    def reservations(self) -> list[str]:
        return self._cli.reservations()

    def run_in_reservation(
        self, reservation: str, node: str, argv: tuple[str, ...], *, timeout_s: float
    ) -> CommandResult:
        return self._cli.run_in_reservation(reservation, node, argv, timeout_s=timeout_s)
