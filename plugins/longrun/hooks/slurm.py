"""SlurmHook: the one place Airflow tasks and triggers talk to Slurm.

Connection type `slurm` (registered in `longrun.provider`). Its extra may hold `slurm_conf` (path of the
cluster's slurm.conf) and `backend` (`auto`, `cli`, `pyslurm`). Without a connection the hook uses
$SLURM_CONF and `auto`, which is what the local stack exports.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from longrun.slurm import ops
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import JobFailedError, JobRetryableError, SdcVerdictError, SlurmError
from longrun.slurm.factory import make_client
from longrun.slurm.models import CommandResult, JobState, NodeState
from longrun.slurm.outcomes import Kind, Outcome, classify
from longrun.slurm.spec import JobSpec


class SlurmHook(BaseHook):
    """Owns every Slurm call of longrun's operators, sensors and triggers."""

    conn_name_attr = "slurm_conn_id"
    default_conn_name = "slurm_default"
    conn_type = "slurm"
    hook_name = "Slurm (longrun)"

    def __init__(
        self,
        slurm_conn_id: str | None = default_conn_name,
        *,
        slurm_conf: str | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        self.slurm_conn_id = slurm_conn_id
        self._slurm_conf = slurm_conf
        self._backend = backend

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["host", "schema", "port", "login", "password"],
            "relabeling": {},
            "placeholders": {"extra": '{"slurm_conf": "/etc/slurm/slurm.conf", "backend": "auto"}'},
        }

    @cached_property
    def _extra(self) -> dict[str, Any]:
        if not self.slurm_conn_id or (self._slurm_conf and self._backend):
            return {}
        try:
            conn = self.get_connection(self.slurm_conn_id)
        except Exception as err:  # no such connection, or no Airflow context (a script, the bench)
            self.log.debug("Slurm connection %r not used: %s", self.slurm_conn_id, err)
            return {}
        return dict(conn.extra_dejson or {})

    @property
    def slurm_conf(self) -> str | None:
        """The slurm.conf path: explicit argument > connection extra > $SLURM_CONF."""
        return self._slurm_conf or self._extra.get("slurm_conf") or os.environ.get("SLURM_CONF") or None

    @property
    def backend(self) -> str:
        return self._backend or str(self._extra.get("backend") or "auto")

    @cached_property
    def client(self) -> SlurmClient:
        return make_client(backend=self.backend, slurm_conf=self.slurm_conf)

    def trigger_kwargs(self) -> dict[str, Any]:
        """What a trigger needs to build the same client in the triggerer (plain values only)."""
        return {"slurm_conf": self.slurm_conf, "backend": self.client.backend}

    # -- jobs ---------------------------------------------------------------------------------------
    def submit(self, spec: JobSpec, *, secret_env: Mapping[str, str] | None = None) -> int:
        return self.client.submit(spec, secret_env=secret_env)

    def job_state(self, job_id: int) -> JobState:
        return self.client.job(job_id)

    def find_jobs(self, tag_prefix: str) -> list[JobState]:
        return self.client.find_jobs(tag_prefix)

    def cancel(self, job_id: int) -> None:
        self.client.cancel(job_id)

    def outcome(self, job_id: int, *, max_restarts: int | None = None) -> Outcome:
        return classify(self.client.job(job_id), max_restarts=max_restarts)

    def check(self, outcome: Outcome) -> JobState:
        """Return the state of a successful job; raise the error family that fits any other final outcome."""
        if outcome.kind is Kind.SUCCESS or outcome.kind is Kind.RUNNING:
            return outcome.state
        if outcome.label == "sdc_verdict":
            raise SdcVerdictError(f"Slurm job ended with the SDC verdict exit code: {outcome.message}")
        if outcome.kind is Kind.RETRYABLE:
            raise JobRetryableError(f"Slurm job ended for a reason outside it, retry: {outcome.message}")
        raise JobFailedError(f"Slurm job did not succeed: {outcome.message}")

    def requeue_excluding(self, job_id: int, exclude: tuple[str, ...]) -> JobState:
        return ops.requeue_excluding(self.client, job_id, exclude)

    def cancel_and_relaunch(self, job_id: int, spec: JobSpec, exclude: tuple[str, ...]) -> int:
        return ops.cancel_and_relaunch(self.client, job_id, spec, exclude)

    # -- nodes --------------------------------------------------------------------------------------
    def nodes(self) -> list[NodeState]:
        return self.client.nodes()

    def node(self, name: str) -> NodeState:
        return self.client.node(name)

    def drain(self, node: str, reason: str) -> None:
        self.client.drain(node, reason)

    def resume(self, node: str) -> None:
        self.client.resume(node)

    def run_on_drained_node(
        self, node: str, argv: tuple[str, ...], *, verdict: Any, timeout_s: float
    ) -> CommandResult:
        return ops.run_on_drained_node(self.client, node, argv, verdict=verdict, timeout_s=timeout_s)

    def test_connection(self) -> tuple[bool, str]:
        try:
            nodes = self.client.nodes()
        except SlurmError as err:
            return False, str(err)
        return True, f"Slurm {self.client.version()} via {self.client.backend}: {len(nodes)} nodes"
