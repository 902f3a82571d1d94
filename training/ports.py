"""The rendezvous port rule, shared by the launch script (longrun.launch), every hot-spare attempt
(longrun.hotspare) and a plain `srun` without a launcher (training.dist).

Attempt a of Slurm job j rendezvous on

    base + (j + a * max(1, span // 2)) mod span

so attempt 0 (and every plain launch) is `base + j mod span`, and consecutive attempts of one job are
half a span apart. The port is always in [base, base + span - 1], whatever the job id.

Defaults: [23500, 30999] (base 23500, span 7500), for any job id and any attempt:
- below Linux's default ephemeral range (net.ipv4.ip_local_port_range 32768-60999), where an outgoing
  connection on the host can hold a port for a moment (a rendezvous once failed on port 33020 that way);
- clear of every port of every local stack (longrun.stack) whose base is in [21050, 23350]: the bench
  slots (21050-21650), the default stack (21800), the test slots (22000-22600) and pinned test bases up
  to 22950 with their two extra slots. Such a stack listens on base .. base + 149 (srun's range
  included), at most 23499, and on base + 10030 .. base + 10034 (SeaweedFS gRPC), at least 31080.

Within a cluster, two jobs on one node share a port only if their ids differ by a multiple of the span.
A site whose nodes use ports in this range sets its own (`NvrxLaunch(port_base=..., port_span=...)`).
"""

from __future__ import annotations

PORT_BASE = 23500
"""First rendezvous port of the default range."""
PORT_SPAN = 7500
"""Number of ports in the default range (the last is PORT_BASE + PORT_SPAN - 1 = 30999)."""


def attempt_offset(span: int) -> int:
    """How far apart (mod span) consecutive attempts of one job rendezvous: half the span, at least 1."""
    return max(1, span // 2)


def rendezvous_port(job_id: int, attempt: int = 0, *, base: int = PORT_BASE, span: int = PORT_SPAN) -> int:
    """The port of attempt `attempt` of job `job_id` (see the module docstring)."""
    if job_id < 0 or attempt < 0 or span < 1:
        raise ValueError(f"need job_id >= 0, attempt >= 0, span >= 1; got {job_id}, {attempt}, {span}")
    return base + (job_id + attempt * attempt_offset(span)) % span


def rendezvous_port_bash(
    *,
    base: int = PORT_BASE,
    span: int = PORT_SPAN,
    job_var: str = "SLURM_JOB_ID",
    attempt_var: str | None = None,
) -> str:
    """The same rule as bash arithmetic (for `$((...))`) over shell variables: the job id in `job_var`,
    the attempt in `attempt_var` (None: attempt 0, the plain launch)."""
    if attempt_var is None:
        return f"{base} + {job_var} % {span}"
    return f"{base} + ({job_var} + {attempt_var} * {attempt_offset(span)}) % {span}"
