"""munged, slurmctld and four slurmd (n1..n4) on 127.0.0.1, all under the state directory."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import time

from . import procs
from .component import Component, Say
from .layout import NODES, Layout
from .procs import ProcRecord, StackError
from .slurm_conf import render_cgroup_conf, render_prolog, render_slurm_conf, slurm_paths
from .slurm_version import detect_version

CTLD_TIMEOUT_S = 30.0
NODE_TIMEOUT_S = 30.0
MUNGE_TIMEOUT_S = 10.0
JOB_DRAIN_TIMEOUT_S = 20.0


class Slurm(Component):
    name = "slurm"

    def __init__(self, layout: Layout) -> None:
        super().__init__(layout)
        self.paths = slurm_paths(layout)
        self.munge_dir = layout.dir("munge")

    # --- environment -------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        if not self.paths["conf"].exists():
            return {}
        return {"SLURM_CONF": str(self.paths["conf"])}

    def _client_env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.paths["conf"])}

    def _run(self, *argv: str, timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, env=self._client_env()
        )

    # --- munge -------------------------------------------------------------------------------
    def _munge_ok(self) -> bool:
        sock = self.munge_dir / "munge.socket"
        return sock.exists() and self._run("munge", "-n", f"--socket={sock}", timeout=5).returncode == 0

    def _start_munge(self, say: Say) -> None:
        if self.live_record("munged") and self._munge_ok():
            say("munged: already running")
            return
        d = self.munge_dir
        d.mkdir(parents=True, exist_ok=True)
        # munged refuses group/world-writable directories; clients need to traverse to the socket.
        d.chmod(0o755)
        key = d / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
        for stale in ("munge.socket", "munge.socket.lock", "munged.pid"):
            (d / stale).unlink(missing_ok=True)
        log = d / "munged.log"
        rec = procs.spawn(
            name="munged",
            argv=[
                "munged",
                "--foreground",
                "--force",  # running as root, in a directory of our own
                f"--socket={d / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={d / 'munged.pid'}",
                f"--log-file={log}",
                f"--seed-file={d / 'munged.seed'}",
            ],
            log=d / "munged.out",
            env=os.environ,
        )
        self._record(rec)
        took = procs.wait_for(self._munge_ok, what="munged", timeout=MUNGE_TIMEOUT_S, log=log, watch=[rec])
        say(f"waiting for munged ... ok ({took:.1f} s)")

    # --- slurmctld ---------------------------------------------------------------------------
    def _ctld_ok(self) -> bool:
        out = self._run("scontrol", "ping", timeout=5)
        return out.returncode == 0 and "UP" in out.stdout

    def _write_config(self) -> None:
        version = detect_version()
        for key in ("dir", "state", "spool"):
            self.paths[key].mkdir(parents=True, exist_ok=True)
        for node in NODES:
            (self.paths["spool"] / node).mkdir(exist_ok=True)
        conf = render_slurm_conf(self.layout, hostname=socket.gethostname(), version=version)
        self.paths["conf"].write_text(conf)
        self.paths["prolog"].write_text(render_prolog(self.layout))
        self.paths["prolog"].chmod(0o755)
        cgroup = render_cgroup_conf(version)
        if cgroup is None:
            self.paths["cgroup_conf"].unlink(missing_ok=True)
        else:
            self.paths["cgroup_conf"].write_text(cgroup)

    def _start_ctld(self, say: Say) -> None:
        if self.live_record("slurmctld") and self._ctld_ok():
            say("slurmctld: already running")
            return
        self._write_config()
        # slurmctld signals the PID in a leftover pid file as "the old slurmctld": never let a
        # stale file point it at a process that reused that PID.
        (self.dir / "slurmctld.pid").unlink(missing_ok=True)
        log = self.paths["ctld_log"]
        rec = procs.spawn(
            name="slurmctld",
            argv=["slurmctld", "-D"],
            log=self.dir / "slurmctld.out",
            env=self._client_env(),
        )
        self._record(rec)
        took = procs.wait_for(self._ctld_ok, what="slurmctld", timeout=CTLD_TIMEOUT_S, log=log, watch=[rec])
        say(f"waiting for slurmctld ... ok ({took:.1f} s)")

    # --- slurmd ------------------------------------------------------------------------------
    def node_states(self) -> dict[str, str]:
        """Node -> long state as sinfo prints it (`idle`, `idle*`, `down*`, `drained`, ...)."""
        out = self._run("sinfo", "-h", "-N", "-o", "%N %T", timeout=10)
        if out.returncode != 0:
            raise StackError(f"sinfo failed: {out.stderr.strip()}")
        states = {}
        for line in out.stdout.splitlines():
            node, _, state = line.strip().partition(" ")
            states[node] = state.strip()
        return states

    def _node_ok(self, node: str) -> bool:
        state = self.node_states().get(node, "")
        base = state.rstrip("*~#!%$@^-").lower()
        # Responding (no `*`) and known; drained or allocated nodes from an earlier use count as up.
        return bool(state) and not state.endswith("*") and base not in ("down", "unknown", "future")

    def _spawn_slurmd(self, node: str) -> ProcRecord:
        (self.dir / f"slurmd-{node}.pid").unlink(missing_ok=True)
        rec = procs.spawn(
            name=f"slurmd-{node}",
            argv=["slurmd", "-D", "-N", node],
            log=self.dir / f"slurmd-{node}.out",
            env=self._client_env(),
        )
        self._record(rec)
        return rec

    def _wait_node(self, node: str, rec: ProcRecord, say: Say) -> None:
        took = procs.wait_for(
            lambda: self._node_ok(node),
            what=f"slurmd {node}",
            timeout=NODE_TIMEOUT_S,
            log=self.dir / f"slurmd-{node}.log",
            watch=[rec],
        )
        say(f"waiting for slurmd {node} ... ok ({took:.1f} s)")

    def _start_nodes(self, say: Say) -> None:
        started = {}
        for node in NODES:
            if self.live_record(f"slurmd-{node}"):
                say(f"slurmd {node}: already running")
                continue
            # A node that slurmctld marked down is revived by its slurmd registering (ReturnToService=2).
            started[node] = self._spawn_slurmd(node)
        for node, rec in started.items():
            self._wait_node(node, rec, say)

    # --- public ------------------------------------------------------------------------------
    def up(self, say: Say) -> None:
        self.forget_dead()
        self._start_munge(say)
        self._start_ctld(say)
        self._start_nodes(say)

    def down(self, say: Say) -> None:
        """Cancel this cluster's jobs, stop the daemons, then end any job step that outlived them.

        slurmstepd daemonizes away from slurmd, so stopping slurmd alone leaves a running job's steps (and
        the trainers under them) alive, holding their ports. They are ours: they carry our SLURM_CONF.
        """
        if self.records() and self._ctld_ok():
            self._run("scancel", "--full", "--quiet", "--partition", "debug", timeout=15)
            deadline = time.monotonic() + JOB_DRAIN_TIMEOUT_S
            while time.monotonic() < deadline and self._run("squeue", "-h", "-o", "%i").stdout.strip():
                time.sleep(0.5)
        super().down(say)
        leftovers = procs.job_step_tree(str(self.paths["conf"]))
        if leftovers:
            say(f"  slurm: ending {len(leftovers)} job-step processes that outlived slurmd")
            procs.kill_pids(leftovers)

    def stop_groups(self, recs: list[ProcRecord]) -> list[list[ProcRecord]]:
        # The four slurmd together, then slurmctld, then munged (both clients of it are gone by then).
        order = [
            [r for r in recs if r.name.startswith("slurmd-")],
            [r for r in recs if r.name == "slurmctld"],
            [r for r in recs if r.name == "munged"],
        ]
        return [g for g in order if g]

    def probe(self, rec: ProcRecord) -> tuple[bool, str]:
        try:
            if rec.name == "munged":
                return (True, "answers") if self._munge_ok() else (False, "socket does not answer")
            if rec.name == "slurmctld":
                return (True, "UP") if self._ctld_ok() else (False, "ping fails")
            node = rec.name.removeprefix("slurmd-")
            state = self.node_states().get(node, "unknown")
            return (not state.endswith("*") and not state.startswith("down"), state)
        except (subprocess.TimeoutExpired, StackError) as exc:
            return False, str(exc)

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL one node's slurmd by its recorded PID (a simulated node failure)."""
        rec = self._node_record(node)
        procs.stop([rec], timeout=10.0, sig=9)

    def restart_slurmd(self, node: str, say: Say = lambda _: None) -> None:
        """Start the node's slurmd again if it is not running, and wait until the node responds."""
        if self.live_record(f"slurmd-{node}") is None:
            self._wait_node(node, self._spawn_slurmd(node), say)

    def _node_record(self, node: str) -> ProcRecord:
        if node not in NODES:
            raise ValueError(f"node must be one of {', '.join(NODES)}, got {node!r}")
        rec = self.live_record(f"slurmd-{node}")
        if rec is None:
            raise StackError(f"slurmd {node} is not running")
        return rec

    def wait_nodes_responding(self, timeout: float = NODE_TIMEOUT_S) -> None:
        """Block until every node answers (e.g. after a restart)."""
        deadline = time.monotonic() + timeout
        for node in NODES:
            rec = self._node_record(node)
            procs.wait_for(
                functools.partial(self._node_ok, node),
                what=f"slurmd {node}",
                timeout=max(0.1, deadline - time.monotonic()),
                watch=[rec],
            )
