"""Debian's PostgreSQL as Airflow's metadata database (`longrun stack up --db postgres`).

Production runs Airflow on PostgreSQL; SQLite serialises every writer and hides the races a real
database shows (row locks, `SELECT ... FOR UPDATE SKIP LOCKED`). This starts one `postgres` server of
our own: data in the state dir, TCP on 127.0.0.1 only, no Unix socket in a shared directory, a
generated password (scram-sha-256), started and stopped by recorded PID. No system service is used.

PostgreSQL refuses to run as root: as root the server runs as the `postgres` user (Debian's package
creates it), which must be able to reach the state dir.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import secrets
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path

from . import procs
from .component import STOP_TIMEOUT_S, Component, Say
from .layout import HOST, Layout
from .procs import ProcRecord, StackError, write_private

DB_NAME = "airflow"
DB_USER = "longrun"
SERVICE_USER = "postgres"
READY_TIMEOUT_S = 60.0
IDLE_IN_TRANSACTION_TIMEOUT = "5min"
"""PostgreSQL ends an Airflow session that sits in an open transaction this long. A session whose
client died while another process still holds its socket (a killed scheduler's forked workers) would
otherwise keep its row locks for ever, and every scheduler skips locked DAG runs. Airflow's own
transactions are short; minutes idle inside one means its client is gone or hung."""
INITDB_TIMEOUT_S = 120.0


def pg_bindir() -> Path:
    """The newest installed PostgreSQL's bin directory (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3].split(".")[0])
    )
    if not found:
        raise StackError("postgres: no PostgreSQL server installed; run scripts/setup-system.sh (postgresql)")
    return Path(found[-1]).parent


def _as_service_user() -> list[str]:
    """Argv prefix that drops root to the postgres user (exec, no fork: the PID stays the server's)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError as exc:
        raise StackError(f"postgres: running as root needs the {SERVICE_USER!r} user") from exc
    return ["setpriv", f"--reuid={SERVICE_USER}", f"--regid={SERVICE_USER}", "--init-groups", "--"]


class Postgres(Component):
    """One PostgreSQL server holding Airflow's metadata database."""

    name = "postgres"

    def __init__(self, layout: Layout) -> None:
        super().__init__(layout)
        self.data = self.dir / "data"
        self.secret_path = self.dir / "password.json"
        self.log = self.dir / "postgres.log"

    def password(self) -> str:
        if not self.secret_path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            write_private(self.secret_path, json.dumps({DB_USER: secrets.token_urlsafe(24)}) + "\n")
        return json.loads(self.secret_path.read_text())[DB_USER]

    def url(self) -> str:
        """SQLAlchemy URL for Airflow (psycopg2; Airflow derives its asyncpg URL from it)."""
        pw = urllib.parse.quote(self.password(), safe="")
        return f"postgresql+psycopg2://{DB_USER}:{pw}@{HOST}:{self.layout.postgres_port}/{DB_NAME}"

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            ent = pwd.getpwnam(SERVICE_USER)
            os.chown(path, ent.pw_uid, ent.pw_gid)

    def _check_reachable(self) -> None:
        if os.geteuid() != 0:
            return
        probe = [*_as_service_user(), "test", "-w", str(self.dir)]
        if subprocess.run(probe, capture_output=True, timeout=10).returncode != 0:
            raise StackError(
                f"postgres: the {SERVICE_USER} user cannot reach {self.dir} (a parent directory is not"
                " searchable by others); use a state dir under a world-searchable path"
            )

    def _initdb(self) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        self._chown(self.dir)
        self._check_reachable()
        pwfile = self.dir / "initdb.pw"
        write_private(pwfile, self.password() + "\n")
        self._chown(pwfile)
        argv = [
            *_as_service_user(),
            str(pg_bindir() / "initdb"),
            f"--pgdata={self.data}",
            f"--username={DB_USER}",
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=scram-sha-256",
            "--encoding=UTF8",
            "--no-instructions",
        ]
        try:
            with open(self.dir / "initdb.log", "ab") as out:
                done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=INITDB_TIMEOUT_S)
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise StackError(f"postgres: initdb failed (rc {done.returncode}); see {self.dir / 'initdb.log'}")
        # Only 127.0.0.1 with a password; nothing else may connect.
        (self.data / "pg_hba.conf").write_text(f"host all all {HOST}/32 scram-sha-256\n")

    def _sql(self, dbname: str, sql: str) -> str:
        env = {**os.environ, "PGPASSWORD": self.password(), "PGCONNECT_TIMEOUT": "3"}
        argv = [str(pg_bindir() / "psql"), "-h", HOST, "-p", str(self.layout.postgres_port)]
        argv += ["-U", DB_USER, "-d", dbname, "-tAqc", sql]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise StackError(f"postgres: {sql!r} failed: {done.stderr.strip()[:200]}")
        return done.stdout.strip()

    def query(self, sql: str) -> str:
        """One statement in Airflow's database as Airflow's role; psql's unaligned output."""
        return self._sql(DB_NAME, sql)

    def _answers(self) -> bool:
        return self._sql("postgres", "SELECT 1") == "1"

    def up(self, say: Say) -> None:
        self.forget_dead()
        if self.live_record("postgres"):
            try:
                if self._answers():
                    say("postgres: already running")
                    return
            except (StackError, subprocess.TimeoutExpired):
                pass
            self.down(say)
        self._initdb()
        argv = [
            *_as_service_user(),
            str(pg_bindir() / "postgres"),
            "-D",
            str(self.data),
            "-c",
            f"listen_addresses={HOST}",
            "-c",
            f"port={self.layout.postgres_port}",
            # No socket in /var/run/postgresql (shared with any other server on the host).
            "-c",
            "unix_socket_directories=",
            "-c",
            "max_connections=100",
            "-c",
            "fsync=on",
        ]
        rec = procs.spawn(name="postgres", argv=argv, log=self.log, env=os.environ, cwd=self.dir)
        self._record(rec)
        took = procs.wait_for(
            self._answers, what="postgres", timeout=READY_TIMEOUT_S, log=self.log, watch=[rec], interval=0.3
        )
        if self._sql("postgres", f"SELECT 1 FROM pg_database WHERE datname = '{DB_NAME}'") != "1":
            self._sql("postgres", f"CREATE DATABASE {DB_NAME}")
        # For Airflow's role in Airflow's database only, as a shared production server would set it;
        # applies to sessions opened from now on (the daemons start after this).
        self._sql(
            "postgres",
            f"ALTER ROLE {DB_USER} IN DATABASE {DB_NAME}"
            f" SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'",
        )
        say(f"waiting for postgres at {HOST}:{self.layout.postgres_port} ... ok ({took:.1f} s)")

    def down(self, say: Say) -> None:
        # SIGTERM is PostgreSQL's "smart" shutdown, which waits for every client to leave; SIGINT
        # ("fast") ends their sessions and stops cleanly.
        recs = self.records()
        if not recs:
            return
        t0 = time.monotonic()
        killed = procs.stop(recs, timeout=STOP_TIMEOUT_S, sig=signal.SIGINT)
        for name in killed:
            say(f"  postgres: {name} ignored SIGINT for {STOP_TIMEOUT_S:.0f} s, killed")
        if any(procs.alive(r) for r in recs):
            raise StackError("postgres: could not stop the server")
        self.records_path.unlink(missing_ok=True)
        say(f"stopped postgres ({time.monotonic() - t0:.1f} s)")

    def probe(self, rec: ProcRecord) -> tuple[bool, str]:
        try:
            return self._answers(), f"database {DB_NAME} on {HOST}:{self.layout.postgres_port}"
        except (StackError, subprocess.TimeoutExpired) as exc:
            return False, str(exc)[:120]
