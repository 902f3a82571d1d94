"""A hot-spare attempt's rendezvous port never lands on a port the local stack listens on.

The step script computes the port in bash; this test runs that same arithmetic in bash for the first
thousand job ids of the default stack and of every test slot, attempts 0-3, and checks each port against
every slot's service ports and srun range (a multiplied job id once drew the S3 server's port)."""

from __future__ import annotations

import subprocess

from helpers.stack_fixtures import TEST_PORT_BASES
from longrun.hotspare import attempt_port_expr
from longrun.launch import NvrxLaunch
from longrun.stack.layout import DEFAULT_PORT_BASE, Layout
from longrun.stack.slurm_conf import first_job_id


def _ports(job_ids: range, attempt: int) -> list[int]:
    expr = attempt_port_expr(NvrxLaunch())
    loop = (
        f"for ((SLURM_JOB_ID={job_ids.start}; SLURM_JOB_ID<{job_ids.stop}; SLURM_JOB_ID++)); do "
        f"LONGRUN_ATTEMPT={attempt}; echo $(({expr})); done"
    )
    out = subprocess.run(["bash", "-c", loop], capture_output=True, text=True, check=True, timeout=60)
    return [int(x) for x in out.stdout.split()]


def test_attempt_ports_stay_clear_of_every_stack_slot(tmp_path) -> None:
    layouts = [Layout(state_dir=tmp_path, port_base=b) for b in (DEFAULT_PORT_BASE, *TEST_PORT_BASES)]
    taken = {p for lay in layouts for p in lay.all_ports()}
    taken |= {p for lay in layouts for p in range(lay.srun_port_range[0], lay.srun_port_range[1] + 1)}
    for lay in layouts:
        first = first_job_id(lay)
        for attempt in range(4):
            ports = _ports(range(first, first + 1000), attempt)
            assert len(ports) == 1000 and not taken & set(ports), (lay.port_base, attempt)


def test_consecutive_attempts_of_a_job_use_distinct_ports() -> None:
    a0, a1 = _ports(range(6001, 6101), 0), _ports(range(6001, 6101), 1)
    assert all(p != q for p, q in zip(a0, a1, strict=True))
    assert a0 == [20000 + j for j in range(6001, 6101)]  # attempt 0 = the plain launch's port
