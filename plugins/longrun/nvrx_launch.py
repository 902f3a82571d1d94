"""The ft_launcher settings of one launch (`NvrxLaunch`): heartbeat timeouts, grace periods, the rendezvous
port range, checked on construction. Both the plain launch (`longrun.launch`) and the hot-spare supervisor's
attempts (`longrun.hotspare`) render them into the batch script."""

from __future__ import annotations

from dataclasses import dataclass

from longrun.slurm import validate as v
from longrun.slurm.errors import InvalidSpecError
from training import ports

#: Rendezvous ports: PORT_BASE + job id mod PORT_SPAN, i.e. 23500-30999 by default, the one rule of
#: training.ports (also hot-spare attempts and training.dist's plain srun). For any job id that stays below
#: Linux's default ephemeral range (32768+) and clear of every local stack slot's ports (see there); a site
#: sets port_base/port_span (NvrxLaunch) to a range its nodes keep free.
PORT_BASE = ports.PORT_BASE
PORT_SPAN = ports.PORT_SPAN


def _positive(name: str, value: object, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= hi:
        raise InvalidSpecError(name, value, f"must be a number in (0, {hi}]")
    return float(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class NvrxLaunch:
    """ft_launcher settings of one launch. Defaults suit minutes-long H100 steps; tests shrink them."""

    initial_heartbeat_timeout_s: float = 1800.0
    """First heartbeat deadline after a (re)start: imports, rendezvous, checkpoint load, the first step."""
    heartbeat_timeout_s: float = 900.0
    """Heartbeat deadline until the trainer has seen a checkpoint save and an audit step; after that NVRx
    uses timeouts calculated from the observed step intervals (times `safety_factor`)."""
    safety_factor: float = 5.0
    """Calculated timeout = longest observed interval x this."""
    workload_check_interval_s: float = 1.0
    """How often each rank monitor checks its rank's heartbeat (NVRx's default, 5 s, delays detection)."""
    monitor_interval_s: float = 0.5
    """How often each agent polls its workers for exits."""
    workers_stop_timeout_s: float = 15.0
    """SIGTERM-to-SIGKILL grace when the agent stops its workers to restart them."""
    term_timeout_s: float = 60.0
    """SIGTERM-to-SIGKILL grace when Slurm cancels the job (the trainer flushes its records)."""
    port_base: int = PORT_BASE
    """Rendezvous port = port_base + job id mod port_span (training.ports; the defaults keep it in 23500-30999)."""
    port_span: int = PORT_SPAN
    """See port_base. Clusters that share one host (test sessions) give each a disjoint range."""
    min_timeout_s: float = 300.0
    """Floor under the calculated heartbeat timeout (training.nvrx): steps slow down under background
    checkpoint uploads and neighbours, beyond anything seen when the timeouts were calculated."""

    def __post_init__(self) -> None:
        _positive("initial_heartbeat_timeout_s", self.initial_heartbeat_timeout_s, 86400)
        _positive("heartbeat_timeout_s", self.heartbeat_timeout_s, 86400)
        _positive("safety_factor", self.safety_factor, 1000)
        if self.safety_factor < 1:
            raise InvalidSpecError("safety_factor", self.safety_factor, "must be >= 1")
        _positive("workload_check_interval_s", self.workload_check_interval_s, 600)
        _positive("monitor_interval_s", self.monitor_interval_s, 600)
        _positive("workers_stop_timeout_s", self.workers_stop_timeout_s, 3600)
        _positive("term_timeout_s", self.term_timeout_s, 3600)
        _positive("min_timeout_s", self.min_timeout_s, 86400)
        v.int_range("port_base", self.port_base, 1024, 65535)
        v.int_range("port_span", self.port_span, 1, 65536 - self.port_base)

    @classmethod
    def for_step_time(cls, step_s: float) -> NvrxLaunch:
        """Settings for an expected step time: generous until the timeouts are calculated in-job."""
        step = _positive("step_s", step_s, 86400)
        return cls(
            initial_heartbeat_timeout_s=max(120.0, 20 * step),
            heartbeat_timeout_s=max(60.0, 20 * step),
            # A loaded 2-core host stalls sub-second CPU steps for tens of seconds: with a 10 s floor the
            # calculated timeouts fired three times in one clean run at load 20 (ft_launcher exit 1).
            min_timeout_s=max(60.0, 20 * step),
        )

    def worker_env(self) -> dict[str, str]:
        """What training.nvrx reads in each worker (see there for why)."""
        return {
            "LONGRUN_NVRX_INITIAL_TIMEOUT_S": f"{self.initial_heartbeat_timeout_s:g}",
            "LONGRUN_NVRX_TIMEOUT_S": f"{self.heartbeat_timeout_s:g}",
            "LONGRUN_NVRX_MIN_TIMEOUT_S": f"{self.min_timeout_s:g}",
        }

    def flags(self) -> list[str]:
        return [
            f"--monitor-interval={self.monitor_interval_s:g}",
            f"--workers-stop-timeout={self.workers_stop_timeout_s:g}",
            f"--term-timeout={self.term_timeout_s:g}",
            f"--ft-initial-rank-heartbeat-timeout={self.initial_heartbeat_timeout_s:g}",
            f"--ft-rank-heartbeat-timeout={self.heartbeat_timeout_s:g}",
            f"--ft-safety-factor={self.safety_factor:g}",
            f"--ft-workload-check-interval={self.workload_check_interval_s:g}",
            # No InfiniBand here or on CPU nodes; the NIC monitor only logs noise there.
            "--ft-enable-nic-monitor=false",
        ]
