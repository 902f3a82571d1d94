"""The local stack as one object: bring components up and down, report status, hand out the env."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

from . import job_access
from .airflow import Airflow
from .component import Component, ProcStatus, Say
from .layout import COMPONENTS, HOST, Layout, ports_in_use
from .procs import StackError
from .s3 import S3
from .slurm import Slurm


class Stack:
    """munge + Slurm (n1..n4), SeaweedFS S3 and Airflow under one state directory."""

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        port_base: int | None = None,
        bucket: str | None = None,
        db: str | None = None,
        schedules: bool | None = None,
        preload_torch: bool | None = None,
        job_user: str | None = None,
        default_job_user: str | None = None,
    ) -> None:
        self.layout = Layout.load(
            Path(state_dir) if state_dir else None,
            default_job_user=default_job_user,
            port_base=port_base,
            bucket=bucket,
            db=db,
            schedules=schedules,
            preload_torch=preload_torch,
            job_user=job_user,
        )
        self.state_dir = self.layout.state_dir
        # A job user only by default (`longrun stack up`, the demo), not asked for: where it cannot run the
        # interpreter, `up` falls back to jobs as the orchestrator's user and says so (see `_job_user_runs`).
        self._job_user_by_default = (
            job_user is None
            and "LONGRUN_STACK_JOB_USER" not in os.environ
            and default_job_user is not None
            and self.layout.job_user == default_job_user
        )
        self.slurm = Slurm(self.layout)
        self.s3 = S3(self.layout)
        self.airflow = Airflow(self.layout, stack_env=self._service_env)
        self.components: dict[str, Component] = {"slurm": self.slurm, "s3": self.s3, "airflow": self.airflow}

    def _service_env(self) -> dict[str, str]:
        return {**self.slurm.env(), **self.s3.env()}

    @staticmethod
    def parse_components(names: Iterable[str] | str | None) -> list[str]:
        """Validate a component selection; None means all, in start order."""
        if names is None:
            return list(COMPONENTS)
        if isinstance(names, str):
            names = [n for n in names.split(",") if n.strip()]
        wanted = [n.strip() for n in names]
        bad = [n for n in wanted if n not in COMPONENTS]
        if bad or not wanted:
            raise ValueError(f"components must be a subset of {', '.join(COMPONENTS)}, got {wanted!r}")
        return [c for c in COMPONENTS if c in wanted]

    def _check_ports(self, component: str) -> None:
        ours = self.layout.ports_of(component)
        busy = ports_in_use(ours)
        if busy:
            raise StackError(
                f"{component}: ports {busy} on {HOST} are taken by something this state dir did not start;"
                f" stop it, or pick another range with LONGRUN_PORT_BASE (now {self.layout.port_base})"
            )

    def up(self, components: Iterable[str] | str | None = None, *, say: Say = print) -> None:
        """Start the selected components (all by default); running ones are reused."""
        selected = self.parse_components(components)
        self.layout.save()
        # Before any daemon writes a secret: what a job may reach, and the user jobs run as.
        job_access.open_to_jobs(self.layout)
        for name in selected:
            comp = self.components[name]
            comp.forget_dead()
            if name == "airflow" and "slurm" not in selected:
                self._job_user_runs(say)  # its workers submit as the job user
            if not comp.is_recorded():
                self._check_ports(name)
            comp.up(say)
            if name == "slurm":
                # Slurm's config exists now; fail before Airflow would submit jobs that cannot run.
                self._job_user_runs(say)

    def _job_user_runs(self, say: Say) -> None:
        """Check that the job user can run jobs (longrun.stack.job_access). A job user that was asked for
        and cannot is an error; the default one falls back, loudly, to jobs as the orchestrator's user, so
        `make demo` runs on a machine whose Python sits in a private home (pyenv under /root)."""
        try:
            job_access.check_job_user_runs(self.layout)
        except StackError as e:
            if not self._job_user_by_default:
                raise
            say(
                f"WARNING: {e}\nWARNING: jobs of this stack run as the orchestrator's user instead (as with"
                " `--job-user none`): a job can then drain nodes and cancel jobs (docs/security.md, item 14)."
                " Build .venv from a Python the job user can read to run jobs as it."
            )
            self.layout = dataclasses.replace(self.layout, job_user=None)
            self.layout.save()
            for comp in (self.slurm, self.s3, self.airflow):
                comp.layout = self.layout

    def down(self, components: Iterable[str] | str | None = None, *, say: Say = print) -> None:
        """Stop what `up` started (by recorded PID), Airflow first; bounded."""
        selected = self.parse_components(components)
        errors = []
        for name in reversed(selected):
            try:
                self.components[name].down(say)
            except StackError as exc:
                errors.append(str(exc))
        if errors:
            raise StackError("; ".join(errors))

    def status(self) -> list[ProcStatus]:
        return [st for comp in self.components.values() for st in comp.status()]

    def running(self, component: str) -> bool:
        """True when the component's every recorded process is alive."""
        return self.components[component].all_alive()

    def env(self) -> dict[str, str]:
        """Client environment of every component that has been set up in this state dir."""
        out: dict[str, str] = {}
        for comp in self.components.values():
            out.update(comp.env())
        return out

    # Fault injection for tests
    def kill_slurmd(self, node: str) -> None:
        """SIGKILL node's slurmd by recorded PID; slurmctld marks the node down after SlurmdTimeout."""
        self.slurm.kill_slurmd(node)

    def restart_slurmd(self, node: str) -> None:
        """Start node's slurmd again (no-op when it runs) and wait until the node responds."""
        self.slurm.restart_slurmd(node)
