"""Rendezvous ports (training.ports): below Linux's ephemeral range and clear of every local stack's ports
for any job id and attempt, the same in bash as in Python, and disjoint between the stack slots' jobs.

The launch and hot-spare scripts compute the port in bash; these tests run that same arithmetic in bash
(the lines the scripts carry), for a whole span of job ids in the millions (every remainder), the job id
windows of every stack slot, and attempts 0-3. Two failures this guards against: a multiplied job id
once drew the S3 server's port, and job 13020's port 33020 (in the ephemeral range) was held by another
connection when its rendezvous host tried to bind it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
from helpers.stack_fixtures import TEST_PORT_BASES
from longrun.hotspare import attempt_port_expr, step_script
from longrun.launch import job_spec_for_run
from longrun.nvrx_launch import NvrxLaunch
from longrun.runspec import RunSpec
from longrun.slurm.spec import JobTag
from longrun.stack.layout import DB_KINDS, DEFAULT_PORT_BASE, SLOT_WIDTH, Layout
from longrun.stack.slurm_conf import JOB_ID_WINDOW, first_job_id

from training import ports

EPHEMERAL_LO = 32768  # Linux's default net.ipv4.ip_local_port_range starts here
BENCH_BASES = tuple(range(21050, 21651, SLOT_WIDTH))  # bench/bench_slurm.py, bench/bench_checkpoints.py
#: Every slot a stack takes on this host by design: the bench slots, the default stack, the test slots,
#: the test slots a pinned LONGRUN_TEST_PORT_BASE (22000 .. 22600) adds (its base + 150, + 300), and the
#: pinned base 22950 (job ids from 13001 under the old windows) with its two extra slots.
STACK_BASES = sorted(
    {
        *BENCH_BASES,
        DEFAULT_PORT_BASE,
        *TEST_PORT_BASES,
        *(b + SLOT_WIDTH * i for b in TEST_PORT_BASES for i in range(3)),
        *(22950 + SLOT_WIDTH * i for i in range(3)),
    }
)
TAG = JobTag(dag_id="training_run", run_id="manual__2026-12-01T00:00:00+00:00", task_id="submit")


def _bash_ports(expr: str, job_ids: Iterable[int], attempt: int) -> list[int]:
    """`expr` (bash arithmetic over SLURM_JOB_ID and LONGRUN_ATTEMPT) evaluated by bash for each job id."""
    ids = "".join(f"{j}\n" for j in job_ids)
    loop = f"LONGRUN_ATTEMPT={attempt}; while read -r SLURM_JOB_ID; do echo $(({expr})); done"
    out = subprocess.run(
        ["bash", "-c", loop], input=ids, capture_output=True, text=True, check=True, timeout=300
    )
    return [int(x) for x in out.stdout.split()]


def _script_expr(line: str) -> str:
    """The arithmetic inside `MASTER_PORT=$((...))` of a script line."""
    start = line.index("MASTER_PORT=$((") + len("MASTER_PORT=$((")
    return line[start : line.index("))", start)]


def _plain_expr(nvrx: NvrxLaunch) -> str:
    spec = job_spec_for_run(
        RunSpec(run_name="p", nodes=2, gpus_per_node=0), tag=TAG, run_dir_root="/r", env={}, nvrx=nvrx
    )
    return _script_expr(next(ln for ln in spec.command if "MASTER_PORT=$((" in ln))


def _attempt_expr(nvrx: NvrxLaunch) -> str:
    run = RunSpec(run_name="h", nodes=2, spare_nodes=1, gpus_per_node=0)
    step = step_script(run, run_dir="/r/h", python="python", launcher="ft_launcher", nvrx=nvrx, store_flag="")
    expr = _script_expr(step)
    assert expr == attempt_port_expr(nvrx)
    return expr


def _stack_ports(tmp_path: Path) -> set[int]:
    """Every port of every stack slot: the whole slot (srun's range and every service in it) and the
    SeaweedFS gRPC ports above it (Layout's own lists, with either Airflow database)."""
    taken: set[int] = set()
    for base in STACK_BASES:
        taken |= set(range(base, base + SLOT_WIDTH))
        for db in DB_KINDS:
            lay = Layout(state_dir=tmp_path, port_base=base, db=db)
            lo, hi = lay.srun_port_range
            taken |= {*lay.all_ports(), *range(lo, hi + 1)}
    return taken


def _windows(tmp_path: Path, bases: Iterable[int], size: int) -> list[int]:
    """The first `size` job ids of each slot's cluster."""
    firsts = [first_job_id(Layout(state_dir=tmp_path, port_base=b)) for b in bases]
    return [j for first in firsts for j in range(first, first + size)]


def test_every_attempt_of_any_job_id_stays_below_the_ephemeral_range_and_off_the_stacks(tmp_path) -> None:
    taken = _stack_ports(tmp_path)
    assert min(taken) == 21050 and max(taken) > EPHEMERAL_LO  # the set is what it claims to be
    # One whole span of consecutive ids (every remainder, so every port any job id can get), in the
    # millions; the first ids of each stack slot's cluster; and ids the old rule sent to 32768+ (13020).
    millions = range(5_000_000, 5_000_000 + ports.PORT_SPAN)
    edge = [1, 13020, 32767, 999_999_999, 2**31 - 1, 2**32 - 2, *_windows(tmp_path, STACK_BASES, 20)]
    job_ids = [*millions, *edge]
    for expr in (_plain_expr(NvrxLaunch()), _plain_expr(NvrxLaunch.for_step_time(0.5))):
        got = set(_bash_ports(expr, job_ids, 0))
        assert got <= set(range(ports.PORT_BASE, EPHEMERAL_LO)), (min(got), max(got))
        assert not got & taken, sorted(got & taken)[:10]
    for attempt in range(4):
        got = set(_bash_ports(_attempt_expr(NvrxLaunch()), job_ids, attempt))
        assert got <= set(range(ports.PORT_BASE, EPHEMERAL_LO)), (attempt, min(got), max(got))
        assert not got & taken, (attempt, sorted(got & taken)[:10])
    # the whole default range is used (a whole span of ids covers it) and it is what the docs state
    assert set(_bash_ports(_plain_expr(NvrxLaunch()), millions, 0)) == set(range(23500, 31000))


@pytest.mark.parametrize(
    ("base", "span"),
    [(ports.PORT_BASE, ports.PORT_SPAN), (10250, 150), (40000, 7), (20000, 1), (1024, 64512)],
)
def test_the_bash_rule_is_the_python_rule(base: int, span: int) -> None:
    """Both scripts' bash lines against training.ports.rendezvous_port, defaults and site overrides."""
    nvrx = NvrxLaunch(port_base=base, port_span=span)
    job_ids = [*range(1, 400), *range(13001, 13100), *range(4_999_990, 5_000_010), 123_456_789, 2**32 - 2]
    assert _bash_ports(_plain_expr(nvrx), job_ids, 0) == [
        ports.rendezvous_port(j, base=base, span=span) for j in job_ids
    ]
    for attempt in range(4):
        assert _bash_ports(_attempt_expr(nvrx), job_ids, attempt) == [
            ports.rendezvous_port(j, attempt, base=base, span=span) for j in job_ids
        ]


def test_training_dist_under_plain_srun_uses_the_launch_rule() -> None:
    from training.dist import _default_port  # imports torch

    job_ids = [1, 13020, 41234, 7_654_321]
    plain = _bash_ports(_plain_expr(NvrxLaunch()), job_ids, 0)
    assert [int(_default_port({"SLURM_JOB_ID": str(j)})) for j in job_ids] == plain
    assert plain == [23501, 29020, 27234, 27821]  # 23500 + id mod 7500
    assert _default_port({}) == "29500"  # no Slurm job: torch's usual port


def test_stack_slots_jobs_never_share_a_port(tmp_path) -> None:
    """Each slot's job id window, every attempt: no port in common with another slot's jobs, so test
    sessions side by side (each in its own slot) cannot take each other's rendezvous ports."""
    expr = _attempt_expr(NvrxLaunch())
    # every slot but the last (23250, the second extra of pinned 22950: it shares bench 21050's window)
    bases = STACK_BASES[:-1]
    assert len({b // SLOT_WIDTH for b in bases}) == len(bases) == 15
    owner: dict[int, int] = {}
    for base in bases:
        first = first_job_id(Layout(state_dir=tmp_path, port_base=base))
        for attempt in range(4):
            for port in _bash_ports(expr, range(first, first + JOB_ID_WINDOW), attempt):
                assert owner.setdefault(port, base) == base, (port, owner[port], base, attempt)


def test_consecutive_attempts_of_a_job_use_distinct_ports() -> None:
    expr = _attempt_expr(NvrxLaunch())
    ids = [*range(2501, 2751), 13020, 7_654_321]
    a0, a1, a2 = (_bash_ports(expr, ids, a) for a in range(3))
    assert all(p != q for p, q in zip(a0, a1, strict=True)) and a2 == a0
    assert a0 == _bash_ports(_plain_expr(NvrxLaunch()), ids, 0)  # attempt 0 = the plain launch's port
