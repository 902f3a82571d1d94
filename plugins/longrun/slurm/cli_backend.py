"""The CLI backend: Slurm's own commands, run without a shell, each with a timeout.

Reads use JSON where the Slurm version has it (`squeue --json`, `sinfo --json`, 21.08+) and
`scontrol -o` lines otherwise and for single objects; 22.05's JSON ignores filters, so every filter is
applied here. After the controller forgets a finished job (MinJobAge), its final state comes from the
jobcomp/filetxt file named by `JobCompLoc` (sacct needs slurmdbd, which a small cluster may not run).
"""

from __future__ import annotations

import getpass
import json
import logging
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path

from longrun.slurm import job_user, parse
from longrun.slurm import validate as v
from longrun.slurm.cli_commands import SlurmCommands
from longrun.slurm.errors import (
    ForeignDrainError,
    InvalidSpecError,
    JobNotFoundError,
    SlurmCommandError,
    SubmitRejectedError,
)
from longrun.slurm.models import CommandResult, JobState, JobStep, NodeState
from longrun.slurm.render import render_sbatch
from longrun.slurm.spec import JobSpec
from longrun.slurm.srun_step import STEP_EXPORT, check_argv, run_srun

log = logging.getLogger(__name__)

_GONE = ("Invalid job id specified", "Job/step already completing or completed", "Invalid job id")


SRUN_ALLOCATION_WAIT_S = 300
"""How long a diagnostic's srun waits for its allocation inside the reservation before it gives up: long
enough for a node still completing its last job (a cluster's epilog health checks take minutes), well
short of the diagnostic's own timeout."""

IN_JOB_STEP_NAME = "longrun-diag-step"
"""srun's name for a diagnostic step inside a running job: `squeue --steps` lists it beside the job's
training steps, whose names carry their attempt and never this one."""


class CliSlurmClient(SlurmCommands):
    """SlurmClient over sbatch/squeue/sinfo/scontrol/scancel/srun."""

    backend = "cli"

    @cached_property
    def jobcomp_path(self) -> Path | None:
        """The jobcomp/filetxt file, or None when the cluster records final states elsewhere."""
        cfg = self.config()
        if cfg.get("JobCompType") != "jobcomp/filetxt":
            return None
        loc = cfg.get("JobCompLoc")
        return Path(loc) if loc and loc.startswith("/") else None

    # -- jobs ---------------------------------------------------------------------------------------
    def submit(self, spec: JobSpec, *, secret_env: Mapping[str, str] | None = None) -> int:
        script = render_sbatch(spec)
        argv = ["sbatch", "--parsable"]
        extra = v.secret_env("secret_env", secret_env)
        if extra:
            # Names on the command line (it overrides the script's --export), values only in sbatch's
            # own environment: the script and `scontrol show job` never hold them.
            argv.append(f"--export={','.join((*spec.export, *sorted(extra)))}")
        if spec.run_as is not None:
            # sbatch runs as the job user, so Slurm gives the job that user's rights (longrun.slurm.job_user).
            user = job_user.resolve(spec.run_as)
            argv = [*job_user.as_user_prefix(user), *argv]
            extra = {**job_user.login_env(user), **extra}
        try:
            out = self._run(argv, stdin=script, extra_env=extra)
        except SlurmCommandError as err:
            raise SubmitRejectedError(f"sbatch refused job {spec.name!r}: {err}") from err
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SubmitRejectedError(f"sbatch printed no job id for {spec.name!r}: {out!r}")
        log.info(
            "submitted Slurm job %s (%s, tag %s, as %s)", job_id, spec.name, spec.comment, spec.run_as or "us"
        )
        return int(job_id)

    def job(self, job_id: int) -> JobState:
        v.int_range("job_id", job_id, 1, 2**32)
        try:
            found = parse.jobs_from_scontrol(self._run(["scontrol", "-o", "show", "job", str(job_id)]))
        except SlurmCommandError as err:
            if not any(s in str(err) for s in _GONE):
                raise
            found = []
        for state in found:
            if state.job_id == job_id:
                return state
        durable = self._from_jobcomp(job_id)
        if durable is None:
            raise JobNotFoundError(f"job {job_id}: unknown to slurmctld and not in the jobcomp record")
        return durable

    def _from_jobcomp(self, job_id: int) -> JobState | None:
        path = self.jobcomp_path
        if path is None or not path.exists():
            return None
        with path.open(errors="replace") as fh:
            return parse.jobs_from_jobcomp(fh).get(job_id)

    def jobs(self) -> list[JobState]:
        if self._has_json:
            argv = ["squeue", "--json"] + (["--states=all"] if self._json_v2 else [])
            return parse.jobs_from_squeue_json(json.loads(self._run(argv)))
        try:
            return parse.jobs_from_scontrol(self._run(["scontrol", "-o", "show", "job"]))
        except SlurmCommandError as err:
            if "No jobs in the system" in str(err):
                return []
            raise

    def find_jobs(self, tag_prefix: str) -> list[JobState]:
        v.tag("tag_prefix", tag_prefix)
        hits = [j for j in self.jobs() if j.comment.startswith(tag_prefix)]
        return sorted(hits, key=lambda j: j.job_id, reverse=True)

    def cancel(self, job_id: int) -> None:
        v.int_range("job_id", job_id, 1, 2**32)
        try:
            self._run(["scancel", str(job_id)])
        except SlurmCommandError as err:
            if not any(s in str(err) for s in _GONE):
                raise

    def requeue_hold(self, job_id: int) -> None:
        v.int_range("job_id", job_id, 1, 2**32)
        self._run(["scontrol", "requeuehold", str(job_id)])

    def set_excluded(self, job_id: int, nodes: tuple[str, ...]) -> None:
        v.int_range("job_id", job_id, 1, 2**32)
        names = v.nodes("nodes", nodes)
        self._run(
            ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(names)}", "StartTime=now"]
        )

    def release(self, job_id: int) -> None:
        v.int_range("job_id", job_id, 1, 2**32)
        self._run(["scontrol", "release", str(job_id)])

    # -- inside a running job ----------------------------------------------------------------------
    def job_steps(self, job_id: int) -> list[JobStep]:
        v.int_range("job_id", job_id, 1, 2**32)
        try:
            out = self._run(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i %j"])
        except SlurmCommandError as err:
            # 22.05 lists no step for a job it does not know; where squeue refuses the id, that means the same.
            if any(s in str(err) for s in _GONE):
                return []
            raise
        return parse.job_steps_from_squeue(out)

    def batch_host(self, job_id: int) -> str | None:
        v.int_range("job_id", job_id, 1, 2**32)
        try:
            return parse.batch_host_from_scontrol(self._run(["scontrol", "-o", "show", "job", str(job_id)]))
        except SlurmCommandError as err:
            if any(s in str(err) for s in _GONE):
                return None
            raise

    def shrink_job(self, job_id: int, nodes: tuple[str, ...]) -> None:
        v.int_range("job_id", job_id, 1, 2**32)
        names = v.nodes("nodes", nodes)
        if not names:
            raise InvalidSpecError("nodes", nodes, "a running job keeps at least one node")
        self._run(["scontrol", "update", f"JobId={job_id}", f"NodeList={','.join(names)}"])

    def run_in_job(
        self, job_id: int, node: str, argv: tuple[str, ...], *, timeout_s: float, overlap: bool = False
    ) -> CommandResult:
        v.int_range("job_id", job_id, 1, 2**32)
        v.node("node", node)
        cmd = check_argv(argv)
        full = [
            "srun",
            f"--jobid={job_id}",
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            f"--job-name={IN_JOB_STEP_NAME}",
            f"--time={max(1, int(timeout_s // 60) + 1)}",
            # The same allow-list as in a reservation: the worker's environment (secrets) stays here.
            f"--export={','.join(STEP_EXPORT)}",
            *(["--overlap"] if overlap else []),
            *cmd,
        ]
        # Slurm creates a step in a job only for the job's own user: start srun as the job's owner.
        owner = self._job_owner(job_id)
        if owner is None:
            return run_srun(full, env=self._env, timeout_s=timeout_s)
        env = {**self._env, **job_user.login_env(owner)}
        return run_srun([*job_user.as_user_prefix(owner), *full], env=env, timeout_s=timeout_s)

    def _job_owner(self, job_id: int) -> job_user.JobUser | None:
        """The Unix user job `job_id` runs as, when it is not this process's user or root; None also for a
        job Slurm no longer lists (a step in it fails on its own)."""
        try:
            uid = self._run(["squeue", "-h", "-j", str(job_id), "-o", "%U"]).strip()
        except SlurmCommandError as err:
            if any(s in str(err) for s in _GONE):
                return None
            raise
        return job_user.of_uid(int(uid)) if uid.isdigit() else None

    # -- nodes --------------------------------------------------------------------------------------
    def node(self, name: str) -> NodeState:
        v.node("node", name)
        found = parse.nodes_from_scontrol(self._run(["scontrol", "-o", "show", "node", name]))
        if not found:
            raise SlurmCommandError(f"node {name!r} is not in the cluster")
        return found[0]

    def nodes(self) -> list[NodeState]:
        # 23.02+ `sinfo --json` groups nodes by state, not by reason: one node's drain reason would be
        # read for another's. `scontrol -o` has one line per node.
        if self._has_json and not self._json_v2:
            return parse.nodes_from_sinfo_json(json.loads(self._run(["sinfo", "--json"])))
        return parse.nodes_from_scontrol(self._run(["scontrol", "-o", "show", "node"]))

    def drain(self, node: str, reason: str) -> None:
        v.node("node", node)
        v.reason("reason", reason, ours=True)
        self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])

    def resume(self, node: str) -> None:
        state = self.node(node)
        if not state.drain_flag and not state.is_down:
            return  # nothing to undo; Slurm would answer rc 1
        if not state.is_ours:
            raise ForeignDrainError(
                f"node {node} is {state.state}+{'+'.join(sorted(state.flags))} with reason {state.reason!r},"
                f" which longrun did not set (ours start with {v.DRAIN_PREFIX!r}): resume it by hand if intended"
            )
        self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])

    # -- reservations -------------------------------------------------------------------------------
    def create_maint_reservation(self, name: str, nodes: tuple[str, ...], duration_min: int) -> str:
        v.name("reservation", name)
        names = v.nodes("nodes", nodes)
        v.int_range("duration_min", duration_min, 1, 7 * 24 * 60)
        self._run(
            [
                "scontrol",
                "create",
                "reservation",
                f"ReservationName={name}",
                f"Nodes={','.join(names)}",
                "StartTime=now",
                f"Duration={duration_min}",
                f"Users={getpass.getuser()}",
                "Flags=maint,ignore_jobs",
            ]
        )
        return name

    def delete_reservation(self, name: str) -> None:
        v.name("reservation", name)
        self._run(["scontrol", "delete", f"ReservationName={name}"])

    def reservations(self) -> list[str]:
        try:
            out = self._run(["scontrol", "-o", "show", "reservation"])
        except SlurmCommandError as err:
            if "No reservations" in str(err):
                return []
            raise
        return [
            parse.parse_kv_line(line)["ReservationName"]
            for line in out.splitlines()
            if "ReservationName=" in line
        ]

    def run_in_reservation(
        self, reservation: str, node: str, argv: tuple[str, ...], *, timeout_s: float
    ) -> CommandResult:
        v.name("reservation", reservation)
        v.node("node", node)
        cmd = check_argv(argv)
        minutes = max(1, int(timeout_s // 60) + 1)
        full = [
            "srun",
            f"--reservation={reservation}",
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            "--job-name=longrun-diag",
            f"--time={minutes}",
            # The node is reserved for this, so the allocation comes once the node is free. One slurmctld
            # lost (killed before it saved the pending job) never comes, and srun would wait out the whole
            # timeout: give up on the allocation after this long instead (values > 1 bound srun's own wait).
            f"--immediate={SRUN_ALLOCATION_WAIT_S}",
            # An allow-list, as for batch jobs: the worker's environment (Airflow's secrets) stays here.
            f"--export={','.join(STEP_EXPORT)}",
            *cmd,
        ]
        return run_srun(full, env=self._env, timeout_s=timeout_s)
