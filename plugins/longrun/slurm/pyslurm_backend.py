"""The pyslurm backend: Slurm's C API through pyslurm, where it is installed and built for this cluster.

pyslurm is built per Slurm release (PyPI has it for 25.11 only; see docs/slurm.md) and is imported lazily,
only when this backend is chosen, by `pyslurm_loader` (which says why it must be done with care).

Quirks of pyslurm 25.11.2 handled here: `load_sbatch_options()` reads a script *path*, so the job is built
from the typed JobSpec fields instead (the rendered script still goes along as the batch script, for the
`export` lines and the command); `time_limit` must be an int; right after RESUME a node reads
IDLE+NOT_RESPONDING for ~1 s and keeps its old reason text. `Reservation.create()` corrupts the heap in
25.11.2 (fixed upstream in 26.05): MAINT reservations are created through the CLI backend, which this class
holds; reading and deleting them goes through pyslurm. An interactive step (srun) has no pyslurm call and
also goes through the CLI. So does a job that runs as another user (`JobSpec.run_as`): libslurm submits
as this process's user, and `longrun.slurm.job_user` starts sbatch as the job user. So does the step
listing of a job: `JobSteps.load` raises for a job that runs no
step and fails with a KeyError for a pending one, where `squeue --steps` answers an empty list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from longrun.slurm import parse
from longrun.slurm import validate as v
from longrun.slurm.cli_backend import CliSlurmClient
from longrun.slurm.errors import (
    BackendUnavailableError,
    ForeignDrainError,
    InvalidSpecError,
    JobNotFoundError,
    SlurmCommandError,
    SubmitRejectedError,
)
from longrun.slurm.models import ACTIVE, CommandResult, JobState, JobStep, NodeState, fold_status
from longrun.slurm.pyslurm_loader import bind, unavailable_reason
from longrun.slurm.render import render_sbatch
from longrun.slurm.spec import JobSpec

# libslurm errors that mean "the job is gone or already done": cancel is then a no-op, as with scancel.
_GONE = ("Invalid job id", "already completing or completed", "already completed")


class PyslurmClient:
    """SlurmClient over pyslurm; creating MAINT reservations, srun steps, listing a job's steps and
    submitting a job as another user delegate to the CLI backend."""

    backend = "pyslurm"

    def __init__(self, *, slurm_conf: str | None = None) -> None:
        conf = slurm_conf or os.environ.get("SLURM_CONF") or None
        self._cli = CliSlurmClient(slurm_conf=conf)
        reason = unavailable_reason(cluster_version=self._cli.version(), slurm_conf=conf)
        if reason:
            raise BackendUnavailableError(reason)
        assert conf is not None
        self._ps = bind(conf)

    def version(self) -> str:
        return self._cli.version()

    # -- jobs ---------------------------------------------------------------------------------------
    def _description(self, spec: JobSpec, secret_env: Mapping[str, str] | None) -> Any:
        # The same allow-list as the CLI's --export: the named variables of the client's environment
        # (SLURM_CONF pointing at this cluster) and the secrets, nothing else of this process.
        base = self._cli._env
        env = {k: base[k] for k in spec.export if k in base}
        env.update(v.secret_env("secret_env", secret_env))
        return self._ps.JobSubmitDescription(
            name=spec.name,
            partitions=[spec.partition],
            nodes=spec.nodes,
            ntasks=spec.nodes * spec.ntasks_per_node,
            ntasks_per_node=spec.ntasks_per_node,
            gres_per_node=f"gpu:{spec.gpu_type}:{spec.gpus_per_node}" if spec.gpus_per_node else None,
            resource_sharing="no" if spec.exclusive else None,
            time_limit=int(spec.time_limit_min),
            log_files_open_mode="append",
            is_requeueable=spec.requeue,
            comment=spec.comment,
            environment=env,
            excluded_nodes=list(spec.exclude) or None,
            required_nodes=list(spec.nodelist) or None,
            reservations=[spec.reservation] if spec.reservation else None,
            working_directory=spec.workdir or os.getcwd(),
            # sbatch's default when --output is absent; stderr goes to the same file, as with sbatch.
            standard_output=spec.output or "slurm-%j.out",
            script=render_sbatch(spec),
        )

    def submit(self, spec: JobSpec, *, secret_env: Mapping[str, str] | None = None) -> int:
        if spec.run_as is not None:
            # libslurm submits as this process's user; sbatch under the job user's identity does not.
            return self._cli.submit(spec, secret_env=secret_env)
        desc = self._description(spec, secret_env)
        try:
            return int(desc.submit())
        except (self._ps.RPCError, ValueError) as err:
            raise SubmitRejectedError(f"pyslurm refused job {spec.name!r}: {err}") from err

    @staticmethod
    def _state(job: Any) -> JobState:
        raw = str(job.state).upper().split("+")[0]
        restarts = int(job.requeue_count or 0)
        # pyslurm gives the state description with spaces; scontrol prints it with underscores: as the CLI.
        text = None if job.state_reason is None else "_".join(str(job.state_reason).split())
        reason = parse.text_or_none(text)
        status = fold_status(raw, restart_count=restarts)
        exit_code, signal = job.exit_code, job.exit_code_signal or None
        if signal:
            exit_code = None
        if status in ACTIVE:  # as the CLI: no exit code until the job is final
            exit_code, signal = None, None
        return JobState(
            job_id=int(job.id),
            status=status,
            slurm_state=raw,
            exit_code=exit_code,
            signal=signal,
            restart_count=restarts,
            nodes=parse.expand_hostlist(job.allocated_nodes),
            reason=reason,
            name=str(job.name or ""),
            comment=str(job.comment or ""),
            held=raw in ("PENDING", "REQUEUE_HOLD") and parse.reason_means_held(reason),
            source="pyslurm",
        )

    def job(self, job_id: int) -> JobState:
        v.int_range("job_id", job_id, 1, 2**32)
        try:
            return self._state(self._ps.Job.load(job_id))
        except self._ps.RPCError:
            pass
        # Forgotten by slurmctld: the durable jobcomp record, as the CLI backend reads it.
        durable = self._cli._from_jobcomp(job_id)
        if durable is None:
            raise JobNotFoundError(f"job {job_id}: unknown to slurmctld and not in the jobcomp record")
        return durable

    def jobs(self) -> list[JobState]:
        return [self._state(j) for j in self._ps.Jobs.load().values()]

    def find_jobs(self, tag_prefix: str) -> list[JobState]:
        v.tag("tag_prefix", tag_prefix)
        hits = [j for j in self.jobs() if j.comment.startswith(tag_prefix)]
        return sorted(hits, key=lambda j: j.job_id, reverse=True)

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> None:
        try:
            fn(*args, **kw)
        except self._ps.RPCError as err:
            raise SlurmCommandError(f"pyslurm {what}: {err}") from err

    def cancel(self, job_id: int) -> None:
        v.int_range("job_id", job_id, 1, 2**32)
        try:
            self._ps.Job(job_id).cancel()
        except self._ps.RPCError as err:
            if not any(s in str(err) for s in _GONE):
                raise SlurmCommandError(f"pyslurm cancel {job_id}: {err}") from err

    def requeue_hold(self, job_id: int) -> None:
        v.int_range("job_id", job_id, 1, 2**32)
        self._call(f"requeue-hold {job_id}", self._ps.Job(job_id).requeue, hold=True)

    def set_excluded(self, job_id: int, nodes: tuple[str, ...]) -> None:
        v.int_range("job_id", job_id, 1, 2**32)
        names = v.nodes("nodes", nodes)
        changes = self._ps.JobSubmitDescription(excluded_nodes=list(names), begin_time="now")
        self._call(f"exclude {names} from {job_id}", self._ps.Job(job_id).modify, changes)

    def release(self, job_id: int) -> None:
        v.int_range("job_id", job_id, 1, 2**32)
        self._call(f"release {job_id}", self._ps.Job(job_id).release)

    # -- inside a running job ----------------------------------------------------------------------
    def job_steps(self, job_id: int) -> list[JobStep]:
        """Through the CLI (`squeue --steps`): pyslurm 25.11.2's `JobSteps.load` raises for a running job
        without steps and fails with a KeyError for a pending job, where squeue lists none."""
        return self._cli.job_steps(job_id)

    def batch_host(self, job_id: int) -> str | None:
        v.int_range("job_id", job_id, 1, 2**32)
        try:
            job = self._ps.Job.load(job_id)
        except self._ps.RPCError as err:
            if any(s in str(err) for s in _GONE):
                return None
            raise SlurmCommandError(f"pyslurm load job {job_id}: {err}") from err
        return str(job.batch_host or "") or None

    def shrink_job(self, job_id: int, nodes: tuple[str, ...]) -> None:
        v.int_range("job_id", job_id, 1, 2**32)
        names = v.nodes("nodes", nodes)
        if not names:
            raise InvalidSpecError("nodes", nodes, "a running job keeps at least one node")
        # `required_nodes` is the job's NodeList (`req_nodes`), what `scontrol update NodeList=` sets.
        changes = self._ps.JobSubmitDescription(required_nodes=list(names))
        self._call(f"shrink {job_id} to {names}", self._ps.Job(job_id).modify, changes)

    def run_in_job(
        self, job_id: int, node: str, argv: tuple[str, ...], *, timeout_s: float, overlap: bool = False
    ) -> CommandResult:
        """Through the CLI (srun): pyslurm has no interactive step."""
        return self._cli.run_in_job(job_id, node, argv, timeout_s=timeout_s, overlap=overlap)

    # -- nodes --------------------------------------------------------------------------------------
    @staticmethod
    def _node_state(n: Any) -> NodeState:
        base, flags = parse.split_node_state(str(n.state))
        return NodeState(name=str(n.name), state=base, flags=flags, reason=parse.strip_reason(n.reason))

    def node(self, name: str) -> NodeState:
        v.node("node", name)
        try:
            return self._node_state(self._ps.Node.load(name))
        except self._ps.RPCError as err:
            raise SlurmCommandError(f"node {name!r} is not in the cluster: {err}") from err

    def nodes(self) -> list[NodeState]:
        return [self._node_state(n) for n in self._ps.Nodes.load().values()]

    def drain(self, node: str, reason: str) -> None:
        v.node("node", node)
        v.reason("reason", reason, ours=True)
        changes = self._ps.Node(state="DRAIN", reason=reason)
        self._call(f"drain {node}", self._ps.Node(node).modify, changes)

    def resume(self, node: str) -> None:
        state = self.node(node)
        if not state.drain_flag and not state.is_down:
            return
        if not state.is_ours:
            raise ForeignDrainError(
                f"node {node} is {state.state}+{'+'.join(sorted(state.flags))} with reason {state.reason!r},"
                f" which longrun did not set (ours start with {v.DRAIN_PREFIX!r}): resume it by hand if intended"
            )
        self._call(f"resume {node}", self._ps.Node(node).modify, self._ps.Node(state="RESUME"))

    # -- reservations -------------------------------------------------------------------------------
    def create_maint_reservation(self, name: str, nodes: tuple[str, ...], duration_min: int) -> str:
        return self._cli.create_maint_reservation(name, nodes, duration_min)

    def delete_reservation(self, name: str) -> None:
        v.name("reservation", name)
        self._call(f"delete reservation {name}", self._ps.Reservation(name=name).delete)

    def reservations(self) -> list[str]:
        return sorted(str(r.name) for r in self._ps.Reservations.load().values())

    def run_in_reservation(
        self, reservation: str, node: str, argv: tuple[str, ...], *, timeout_s: float
    ) -> CommandResult:
        return self._cli.run_in_reservation(reservation, node, argv, timeout_s=timeout_s)
