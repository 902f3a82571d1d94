"""Airflow 3.3 on SQLite with LocalExecutor, trimmed for 2 cores, API on 127.0.0.1.

This runs what `airflow standalone` runs (scheduler, dag-processor, triggerer, api-server) but as four
daemons of our own, for three reasons: standalone ignores SIGINT and orphans its children on SIGTERM,
so it cannot be stopped cleanly by PID; its scheduler and triggerer start log servers on 0.0.0.0
(`--skip-serve-logs` avoids them: every component shares this AIRFLOW_HOME, so logs are read from
disk); and each component gets its own log file and health line.

Config goes to `$AIRFLOW_HOME/airflow.cfg`, so any `airflow` command run with this AIRFLOW_HOME sees the
same settings. Secrets (JWT, API secret, Fernet key, admin password) are generated on first start and
kept 0600 in the state dir.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from . import procs
from .airflow_cfg import ADMIN_USER, DRILL_OPERATORS, DRILL_OPERATORS_ENV, LOGINS, render_airflow_cfg
from .component import Component, ProcStatus, Say
from .job_access import JOB_USER_ENV
from .layout import Layout, repo_root
from .postgres import Postgres
from .procs import ProcRecord, StackError, write_private
from .scheduler_preload import PRELOAD_ENV

# Modules the scheduler imports at its start when the layout's preload_torch is on (scheduler_preload.py).
SCHEDULER_PRELOAD = ("torch",)

MIGRATE_TIMEOUT_S = 300.0
READY_TIMEOUT_S = 300.0  # ~15 s on an idle 2-core machine; minutes when it is busy
HEALTH_TIMEOUT_S = 15.0  # one answer of the health endpoint
# Start order.
DAEMONS = (
    ("api-server", ["api-server"]),
    ("scheduler", ["scheduler", "--skip-serve-logs"]),
    ("dag-processor", ["dag-processor"]),
    ("triggerer", ["triggerer", "--skip-serve-logs"]),
)
_HEALTH_KEYS = {"scheduler": "scheduler", "dag-processor": "dag_processor", "triggerer": "triggerer"}


def torch_mapped(pid: int) -> bool:
    """Whether process `pid` has torch's C library mapped, i.e. has imported torch (`preload_torch`)."""
    with open(f"/proc/{pid}/maps") as f:
        return any("libtorch" in line for line in f)


def airflow_bin() -> Path:
    """The `airflow` script of the virtualenv this Python belongs to."""
    path = Path(sys.executable).parent / "airflow"
    if not path.exists():
        raise StackError(f"airflow: no `airflow` next to {sys.executable}; install the project's .venv")
    return path


class Airflow(Component):
    name = "airflow"

    def __init__(self, layout: Layout, *, stack_env: Callable[[], dict[str, str]] = dict) -> None:
        super().__init__(layout)
        self.home = self.dir
        self.stack_env = stack_env
        self.secrets_path = self.home / "secrets.json"
        self.passwords_path = self.home / "passwords.json"
        # Only with `--db postgres`: started before the daemons, stopped after them.
        self.db = Postgres(layout) if layout.db == "postgres" else None
        # Run dirs of the jobs this stack's workers submit (LONGRUN_RUN_ROOT; Layout.run_root).
        self.run_root = str(layout.run_root)

    def _secrets(self) -> dict[str, str]:
        if self.secrets_path.exists():
            return json.loads(self.secrets_path.read_text())
        self.home.mkdir(parents=True, exist_ok=True)
        values = {
            "jwt_secret": secrets.token_urlsafe(48),
            "api_secret_key": secrets.token_urlsafe(32),
            "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        }
        write_private(self.secrets_path, json.dumps(values) + "\n")
        return values

    def password(self, login: str = ADMIN_USER) -> str:
        """The password of `login` (one of LOGINS; default the admin's). Every login's is written by us
        before the first start, so the API never prints one; a login added later gets one at the next call."""
        known = json.loads(self.passwords_path.read_text()) if self.passwords_path.exists() else {}
        missing = {name: secrets.token_urlsafe(18) for name in LOGINS if name not in known}
        if missing:
            self.home.mkdir(parents=True, exist_ok=True)
            write_private(self.passwords_path, json.dumps({**known, **missing}) + "\n")
            known.update(missing)
        return str(known[login])

    def env(self) -> dict[str, str]:
        if not self.passwords_path.exists():
            return {}
        return {
            "LONGRUN_AIRFLOW_URL": self.layout.airflow_url,
            "LONGRUN_AIRFLOW_USER": ADMIN_USER,
            "LONGRUN_AIRFLOW_PASSWORD": self.password(),
            "AIRFLOW_HOME": str(self.home),
            "LONGRUN_RUN_ROOT": self.run_root,
        }

    def daemon_env(self) -> dict[str, str]:
        """Environment for Airflow's processes and the tasks they run."""
        bindir = str(Path(sys.executable).parent)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
        env.update(self.stack_env())
        env.update(
            AIRFLOW_HOME=str(self.home),
            LONGRUN_RUN_ROOT=self.run_root,
            # Tasks spawn `airflow`, `sbatch` and Python: the venv's bin comes first.
            PATH=bindir + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
            PYTHONUNBUFFERED="1",
        )
        env.pop("AIRFLOW_CONFIG", None)
        # The workers submit jobs as the stack's job user (longrun.runroot, longrun.stack.job_access).
        env.pop(JOB_USER_ENV, None)
        if self.layout.job_user is not None:
            env[JOB_USER_ENV] = self.layout.job_user
        # Who may set a drill (longrun.drill_grant): the stack's admin, unless the caller says otherwise.
        # Airflow reads a Variable from its environment before its database: set here, it wins over one
        # set in the UI.
        env.setdefault(DRILL_OPERATORS_ENV, DRILL_OPERATORS)
        # The site's directory of `script:` entrypoints (longrun.runspec): on the local stack, the
        # repository's examples, unless the caller names another.
        root = repo_root()
        if root is not None:
            env.setdefault("LONGRUN_ENTRYPOINT_DIR", str(root / "examples"))
        return env

    def _write_config(self) -> None:
        root = repo_root()
        if root is None:
            raise StackError(
                "airflow: cannot find the repository (dags/, plugins/); install longrun editable"
            )
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "logs").mkdir(exist_ok=True)
        text = render_airflow_cfg(
            layout=self.layout,
            home=self.home,
            dags=root / "dags",
            plugins=root / "plugins",
            secrets_=self._secrets(),
            db_url=self.db.url() if self.db else None,
        )
        write_private(self.home / "airflow.cfg", text)
        self.password()
        # Airflow imports $AIRFLOW_HOME/config/airflow_local_settings.py in each of its processes.
        local_settings = self.home / "config" / "airflow_local_settings.py"
        if self.layout.preload_torch:
            local_settings.parent.mkdir(exist_ok=True)
            shutil.copyfile(Path(__file__).with_name("scheduler_preload.py"), local_settings)
        else:
            local_settings.unlink(missing_ok=True)

    def health(self) -> dict[str, str]:
        """Component -> status from the API's health endpoint (no auth needed). The timeout is generous: on
        a loaded 2-core machine a live API server once took over 3 s to answer, and `stack status` called
        a healthy stack SICK."""
        url = f"{self.layout.airflow_url}/api/v2/monitor/health"
        with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as r:
            data = json.load(r)
        return {k: str(v.get("status")) for k, v in data.items() if isinstance(v, dict)}

    def _all_healthy(self) -> bool:
        h = self.health()
        return all(h.get(k) == "healthy" for k in ("metadatabase", *_HEALTH_KEYS.values()))

    def up(self, say: Say) -> None:
        self.forget_dead(say)
        if self.all_alive() and len(self.records()) == len(DAEMONS):
            try:
                if self._all_healthy():
                    say("airflow: already running")
                    return
            except OSError:
                pass
        # Partly running: start over, so every component reads the same fresh config.
        if self.records():
            self.down(say)
        if self.db:
            self.db.up(say)
        self._write_config()
        env = self.daemon_env()
        migrate_log = self.home / "db-migrate.log"
        with open(migrate_log, "ab") as out:
            try:
                done = subprocess.run(
                    [str(airflow_bin()), "db", "migrate"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    timeout=MIGRATE_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired as exc:
                raise StackError(
                    f"airflow: db migrate took over {MIGRATE_TIMEOUT_S:.0f} s; see {migrate_log}"
                ) from exc
        if done.returncode != 0:
            raise StackError(f"airflow: db migrate failed (rc {done.returncode}); see {migrate_log}")
        say("airflow: database migrated")
        recs = [self._spawn(name, args, env) for name, args in DAEMONS]
        took = procs.wait_for(
            self._all_healthy,
            what="airflow (api-server, scheduler, dag-processor, triggerer)",
            timeout=READY_TIMEOUT_S,
            log=self.home / "api-server.log",
            watch=recs,
            interval=0.5,
        )
        say(f"waiting for airflow at {self.layout.airflow_url} ... ok ({took:.1f} s)")

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> ProcRecord:
        if self.db:
            # Names the daemon in pg_stat_activity (libpq reads it), so an operator can tell whose
            # session holds a lock.
            env = {**env, "PGAPPNAME": f"airflow-{name}"}
        if name == "scheduler" and self.layout.preload_torch:
            # Its LocalExecutor workers and their tasks are forks of it: they inherit the imports.
            env = {**env, PRELOAD_ENV: ",".join(SCHEDULER_PRELOAD)}
        rec = procs.spawn(
            name=name, argv=[str(airflow_bin()), *args], log=self.home / f"{name}.log", env=env, cwd=self.home
        )
        self._record(rec)
        return rec

    def restart(self, name: str, say: Say) -> None:
        """Start one daemon again after it died, the others running on: first end what the dead one
        left behind (`forget_dead`), then start it as `up` does and wait until all are healthy."""
        args = dict(DAEMONS).get(name)
        if args is None:
            raise ValueError(f"name must be one of {[n for n, _ in DAEMONS]}, got {name!r}")
        if self.live_record(name):
            say(f"airflow: {name} already running")
            return
        self.forget_dead(say)
        rec = self._spawn(name, args, self.daemon_env())
        took = procs.wait_for(
            self._all_healthy, what=f"airflow {name}", timeout=READY_TIMEOUT_S, log=rec.log, watch=[rec]
        )
        say(f"airflow: {name} restarted ({took:.1f} s)")

    def end_leftovers(self, say: Say | None = None) -> list[int]:
        """SIGKILL what dead daemons left in their sessions; the PIDs ended.

        A SIGKILLed scheduler's LocalExecutor workers live on holding its database connections: on
        PostgreSQL an open transaction keeps the row locks it took (`idle in transaction`) and every
        new scheduler skips those rows (SKIP LOCKED), so a DAG run stalls until they end. A dead
        triggerer's or dag-processor's children would go on working beside their successor. A
        service manager ends the whole group when the main process dies; this does the same for
        the processes this stack started. The note goes to `say` and to the dead daemon's log."""
        ended: list[int] = []
        for rec in super().records():
            if procs.alive(rec):
                continue
            pids = procs.end_leftovers(rec)
            if not pids:
                continue
            ended.extend(pids)
            line = f"airflow: ended {len(pids)} processes the dead {rec.name} (pid {rec.pid}) left: {pids}"
            if say:
                say(line)
            with open(rec.log, "a") as f:
                f.write(f"longrun stack: {line}\n")
        return ended

    # The database is part of this component: reported, reused and stopped with it.
    def down(self, say: Say) -> None:
        self.end_leftovers(say)
        super().down(say)
        if self.db:
            self.db.down(say)

    def status(self) -> list[ProcStatus]:
        return [*super().status(), *(self.db.status() if self.db else [])]

    def is_recorded(self) -> bool:
        return super().is_recorded() or bool(self.db and self.db.is_recorded())

    def all_alive(self) -> bool:
        return super().all_alive() and (self.db is None or self.db.all_alive())

    def forget_dead(self, say: Say | None = None) -> None:
        self.end_leftovers(say)
        super().forget_dead()
        if self.db:
            self.db.forget_dead()

    def stop_groups(self, recs: list[ProcRecord]) -> list[list[ProcRecord]]:
        # Independent processes that share only the database: stop them together (each ends its
        # own workers), so `down` waits for the slowest rather than for the sum.
        return [recs]

    def probe(self, rec: ProcRecord) -> tuple[bool, str]:
        try:
            h = self.health()
        except (OSError, ValueError) as exc:
            return False, f"API does not answer: {exc}"[:120]
        if rec.name == "api-server":
            return True, f"metadatabase {h.get('metadatabase')}"
        status = h.get(_HEALTH_KEYS[rec.name], "unknown")
        return status == "healthy", status

    def login_ok(self, *, timeout_s: float = 30.0) -> bool:
        """Whether POST /auth/token accepts the admin password. The first login after a start can take
        seconds on 2 busy cores (a clean-clone test run timed out at 5 s): as long as the API client waits."""
        body = json.dumps({"username": ADMIN_USER, "password": self.password()}).encode()
        req = urllib.request.Request(
            f"{self.layout.airflow_url}/auth/token",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return "access_token" in json.load(r)
        except urllib.error.HTTPError:
            return False
