"""The one adapter over NVIDIA Resiliency Extension (NVRx): what the trainer asks of it, in one place.

What it does for the trainer:

- `NvrxMonitor`: the heartbeat client. Under NVRx's `ft_launcher` it connects to the rank monitor, sends a
  heartbeat at the end of every step and, once a checkpoint save and an audit step (the two slowest kinds
  of step) have both been seen, lets NVRx calculate the hang timeouts from the observed intervals. Earlier
  than that the calculated timeouts come out tiny (a 0.3 s heartbeat on a fast loop, measured here) and the
  first checkpoint save would be taken for a hang. Outside ft_launcher every call is a no-op.
- `NvrxMonitor.request_shutdown(reason)`: on an SDC verdict, ask ft_launcher not to restart the workers in
  place. NVRx 0.4.1 has no "do not restart" exit code: the request is a workload-control message with
  `WorkloadAction.ShutdownWorkload`, which closes the rendezvous so no agent starts a new round. The
  trainer then exits with `schema.EXIT_SDC_VERDICT` (93), the code NVRx 0.5+ honours natively.
- `python -m training.nvrx launch-verdict`: after `srun` returns, the job script asks whether this launch
  wrote an alert record (`training.launch_records.alerts_since`); if so the job exits 93 whatever
  ft_launcher returned (in 0.4.1 a closed rendezvous makes every agent exit 1).

What an in-job restart changes (drills dropped, the checkpoint resumed) is in `training.nvrx.restart`.

Version differences live in `Capabilities` (only 0.4.1 runs here: 0.5+ wheels need glibc >= 2.39, 0.7
needs Python 3.12; see docs/nvrx.md). NVRx and torch are imported only when a monitor is really started,
so `python -m training.nvrx` stays cheap.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from training.launch_records import alerts_since, restarts_since

log = logging.getLogger("training.nvrx")

DIST_NAME = "nvidia-resiliency-ext"
#: ft_launcher sets these in every worker it starts (the first is the rank monitor's socket).
RANK_MONITOR_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
LAUNCHER_ENV = "FT_LAUNCHER_IPC_SOCKET"
#: Exported by the job script (longrun.launch), in seconds: the launcher's heartbeat timeouts before any
#: calculation (NVRx 0.4.1's rank monitor keeps calculated timeouts across in-job restarts, so each new
#: incarnation puts these back), and the floor under calculated timeouts.
INITIAL_TIMEOUT_ENV = "LONGRUN_NVRX_INITIAL_TIMEOUT_S"
TIMEOUT_ENV = "LONGRUN_NVRX_TIMEOUT_S"
MIN_TIMEOUT_ENV = "LONGRUN_NVRX_MIN_TIMEOUT_S"
DEFAULT_MIN_TIMEOUT_S = 30.0
TESTED_VERSIONS = ("0.4.1",)


def parse_version(text: str) -> tuple[int, int, int]:
    """`0.4.1` -> (0, 4, 1); suffixes (`0.5.0rc1`, `0.7.0+cu12`) are ignored."""
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if m is None:
        raise ValueError(f"NVRx version {text!r} is not of the form MAJOR.MINOR[.PATCH]")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Capabilities:
    """What the installed NVRx offers, by version (only 0.4.1 was run here; the rest is from release notes)."""

    version: str
    """The installed version string, or "" when NVRx is not installed."""
    workload_control: bool
    """`RankMonitorClient.send_workload_control_request` with `WorkloadAction.ShutdownWorkload` (0.4+)."""
    native_no_restart_exit: bool
    """ft_launcher itself does not restart a worker that exits 93 (0.5+)."""
    straggler_module: str
    """Import path of straggler detection (moved under `attribution` in 0.7)."""
    nvml_health_checks: bool
    """inprocess.Wrapper adds NVML GPU health checks when LOCAL_RANK is set (0.7): they fail without a GPU."""

    @property
    def installed(self) -> bool:
        return bool(self.version)

    @property
    def tested(self) -> bool:
        return self.version in TESTED_VERSIONS


def capabilities(version: str | None = None) -> Capabilities:
    """Capabilities of `version`, or of the installed NVRx when None."""
    if version is None:
        try:
            version = metadata.version(DIST_NAME)
        except metadata.PackageNotFoundError:
            version = ""
    v = parse_version(version) if version else (0, 0, 0)
    return Capabilities(
        version=version,
        workload_control=v >= (0, 4, 0),
        native_no_restart_exit=v >= (0, 5, 0),
        straggler_module=(
            "nvidia_resiliency_ext.attribution.straggler"
            if v >= (0, 7, 0)
            else "nvidia_resiliency_ext.straggler"
        ),
        nvml_health_checks=v >= (0, 7, 0),
    )


def under_ft_launcher(env: Mapping[str, str] | None = None) -> bool:
    """True in a worker that NVRx's ft_launcher started (its rank monitor socket is in the environment)."""
    env = os.environ if env is None else env
    return bool(env.get(RANK_MONITOR_ENV))


def local_restart_count(env: Mapping[str, str] | None = None) -> int:
    """How often this worker's own agent restarted its workers (TORCHELASTIC_RESTART_COUNT; 0 if unset).

    It counts per agent: an agent whose workers were healthy but restarted because another node failed
    keeps 0 (a membership change is not a retry). `NvrxMonitor.restart_count` takes the job-wide max.
    """
    env = os.environ if env is None else env
    raw = env.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"TORCHELASTIC_RESTART_COUNT={raw!r} is not an integer") from None


class NvrxMonitor:
    """Heartbeats and the shutdown request for one rank. Construct with `from_env`; a no-op off ft_launcher.

    Call order: `start()` after the process group exists (timeout calculation is a collective), then
    `step_done(...)` at the end of every step on every rank, `request_shutdown(reason)` on an SDC verdict,
    `close()` at exit. `step_done` must see the same `saved`/`audited` values on every rank (they follow
    from the step number), since the timeout calculation it may trigger all-reduces across ranks.
    """

    def __init__(self, *, active: bool, need_saved: bool = True, need_audited: bool = True) -> None:
        self.active = active
        self.need_saved, self.need_audited = need_saved, need_audited
        self.caps = capabilities() if active else capabilities("")
        self.restart_count = local_restart_count()
        self._client: Any = None
        self._seen_saved = self._seen_audited = False
        self.timeouts_calculated_at: int | None = None
        self.heartbeats = 0
        self._initial_s = self._before_calc_s = self._min_s = 0.0

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, need_saved: bool = True, need_audited: bool = True
    ) -> NvrxMonitor:
        """A live monitor under ft_launcher, else a no-op one. `need_audited=False` when audits are off
        (recompute_every=0): then a checkpoint save alone unlocks the timeout calculation."""
        return cls(active=under_ft_launcher(env), need_saved=need_saved, need_audited=need_audited)

    def start(self) -> None:
        """Connect to the rank monitor and agree on the job-wide restart count (max over ranks)."""
        if not self.active:
            return
        import torch
        import torch.distributed as dist
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        if not self.caps.tested:
            log.warning(
                "NVRx %s is not a version longrun was tested with (%s)", self.caps.version, TESTED_VERSIONS
            )
        client = RankMonitorClient()
        client.init_workload_monitoring()
        self._client = client
        # The rank monitor outlives its workers and keeps timeouts calculated by the previous incarnation
        # (their `initial` is the old start-up time, far too short for imports + checkpoint load).
        env = os.environ
        self._initial_s = float(env.get(INITIAL_TIMEOUT_ENV) or client.cfg.initial_rank_heartbeat_timeout)
        self._before_calc_s = float(env.get(TIMEOUT_ENV) or client.cfg.rank_heartbeat_timeout)
        self._min_s = float(env.get(MIN_TIMEOUT_ENV) or DEFAULT_MIN_TIMEOUT_S)
        self._set_timeouts(initial=self._initial_s, subsequent=self._before_calc_s, calculated=False)
        if dist.is_available() and dist.is_initialized():
            t = torch.tensor([self.restart_count], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            self.restart_count = int(t.item())
        log.info(
            "NVRx %s heartbeats on (restart %d, initial timeouts %s)",
            self.caps.version,
            self.restart_count,
            client.hb_timeouts,
        )

    def step_done(self, step: int, *, saved: bool = False, audited: bool = False) -> None:
        """Heartbeat for `step`; the first time both a save and an audit have been seen, calculate timeouts."""
        if self._client is None:
            return
        self._client.send_heartbeat()
        self.heartbeats += 1
        if self.heartbeats == 1:  # bench/bench_nvrx.py reads this line: the job is training again
            log.info("NVRx first heartbeat of restart %d at step %d", self.restart_count, step)
        self._seen_saved |= saved
        self._seen_audited |= audited
        ready = (self._seen_saved or not self.need_saved) and (self._seen_audited or not self.need_audited)
        if ready and self.timeouts_calculated_at is None:
            if self._client.calculate_and_set_hb_timeouts(skip_if_not_ready=True):
                self.timeouts_calculated_at = step
                got = self._client.hb_timeouts
                # A floor: background checkpoint uploads and other jobs on the node slow later steps
                # well beyond the intervals seen so far (0.5 s timeouts were seen to kill healthy ranks).
                if got.subsequent < self._min_s:
                    self._set_timeouts(initial=self._initial_s, subsequent=self._min_s, calculated=True)
                log.info("NVRx heartbeat timeouts calculated at step %d: %s", step, self._client.hb_timeouts)

    def _set_timeouts(self, *, initial: float, subsequent: float, calculated: bool) -> None:
        # load_state_dict is the public way to hand the rank monitor explicit heartbeat timeouts.
        hb = {"initial": initial, "subsequent": subsequent, "were_calculated": calculated}
        self._client.load_state_dict({"current_timeouts": {"heartbeat": hb}})

    @property
    def timeouts(self) -> dict[str, Any]:
        """The heartbeat timeouts in force (for records and logs)."""
        t = getattr(self._client, "hb_timeouts", None)
        if t is None:
            return {}
        return {"initial_s": t.initial, "subsequent_s": t.subsequent, "calculated": bool(t.were_calculated)}

    def info(self) -> dict[str, Any]:
        """What a progress record carries about NVRx: active, version, job-wide restart count, timeouts."""
        return {
            "active": self.active,
            "version": self.caps.version,
            "restart_count": self.restart_count,
            "timeouts_calculated_at": self.timeouts_calculated_at,
            **({"timeouts": self.timeouts} if self.timeouts else {}),
        }

    def request_shutdown(self, reason: str) -> bool:
        """Ask ft_launcher to stop instead of restarting (an SDC verdict). True if the request was sent.

        Never raises: the caller exits 93 next whatever happens here, and the alert record is the evidence.
        """
        if self._client is None:
            log.info("not under ft_launcher: no shutdown request needed (%s)", reason)
            return False
        if not self.caps.workload_control:
            log.warning("NVRx %s has no workload control; relying on exit code 93", self.caps.version)
            return False
        try:
            from nvidia_resiliency_ext.fault_tolerance import WorkloadAction, WorkloadControlRequest

            req = WorkloadControlRequest(WorkloadAction.ShutdownWorkload, description=reason[:500])
            self._client.send_workload_control_request(req)
        except Exception as e:  # the exit code still carries the verdict
            log.error("NVRx shutdown request failed (%s): %s", reason, e)
            return False
        log.warning("asked ft_launcher to shut the workload down, no restart: %s", reason)
        return True

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.shutdown_workload_monitoring()
            finally:
                self._client = None


def _launch_verdict(args: argparse.Namespace) -> int:
    store = None
    if args.store:
        from training.store.factory import store_from_env

        store = store_from_env()
    found = alerts_since(Path(args.run_dir), args.since, run=args.run, store=store)
    for item in found:
        print(f"alert: {item}")
    restarts = restarts_since(Path(args.run_dir), args.since)
    if restarts is not None:
        print(f"in-job restarts in this launch: {restarts}")
    return 0 if found else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.nvrx", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("launch-verdict", help="exit 0 if this launch wrote an alert record, else 1")
    v.add_argument("--run-dir", required=True)
    v.add_argument("--run", default=None, help="run name (needed with --store)")
    v.add_argument("--since", type=float, required=True, help="launch start, epoch seconds")
    v.add_argument("--store", action="store_true", help="also look in the store the environment names")
    sub.add_parser("version", help="print the installed NVRx version and capabilities as JSON")
    args = p.parse_args(argv)
    if args.cmd == "version":
        caps = capabilities()
        print(json.dumps({f: getattr(caps, f) for f in caps.__slots__} | {"tested": caps.tested}))
        return 0
    if args.store and not args.run:
        p.error("--store needs --run")
    return _launch_verdict(args)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
