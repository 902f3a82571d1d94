"""Where the stack keeps its files and which 127.0.0.1 ports it uses.

All ports are offsets from one base (default 21800), a range no common service uses. SeaweedFS also
listens on each of its ports + 10000 (gRPC); with a base up to 22600 those stay below Linux's
ephemeral range (32768+), where an outgoing connection could hold one. One stack spans SLOT_WIDTH
ports from its base (plus the gRPC ones), so stacks SLOT_WIDTH apart never collide. The default
rendezvous ports of training jobs (training.ports: 23500-30999) lie between the slots and the gRPC ports
of every base from 21050 to 23350: a new slot goes there.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

HOST = "127.0.0.1"
DEFAULT_PORT_BASE = 21800
SLOT_WIDTH = 150
DEFAULT_BUCKET = "longrun"
NODES = ("n1", "n2", "n3", "n4")
PARTITION = "debug"
COMPONENTS = ("slurm", "s3", "airflow")
DB_KINDS = ("sqlite", "postgres")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
DEFAULT_JOB_USER = "longrun-job"
NO_JOB_USER = "none"
"""Said for the job user (`--job-user none`, LONGRUN_STACK_JOB_USER=none): jobs run as the orchestrator."""


def ports_in_use(ports: list[int]) -> list[int]:
    """The ports among `ports` that something already holds on 127.0.0.1."""
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((HOST, port))
            except OSError:
                busy.append(port)
    return busy


def check_job_user(name: object) -> str:
    """`name`, when it is a plain Unix user name (1-32 of [a-z0-9_-]) and not root; else ValueError."""
    if not isinstance(name, str) or not _USER_RE.match(name):
        raise ValueError(f"job_user must be a Unix user name (1-32 of [a-z0-9_-]) or None, got {name!r}")
    if name == "root":
        raise ValueError("job_user must not be root: jobs as root can do everything the orchestrator does")
    return name


def repo_root() -> Path | None:
    """The repository this package runs from (an editable install), else None."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").is_file() and (root / "dags").is_dir() else None


def default_state_dir() -> Path:
    """`$LONGRUN_STATE_DIR`, else `<repo>/.state/stack`, else `./.state/stack`."""
    if env := os.environ.get("LONGRUN_STATE_DIR"):
        return Path(env).resolve()
    return (repo_root() or Path.cwd()) / ".state" / "stack"


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """The stack's state directory and port plan."""

    state_dir: Path
    """Everything the stack writes lives under here (configs, keys, data, logs, PID records)."""
    port_base: int = DEFAULT_PORT_BASE
    """First port of the stack's range; components use fixed offsets from it (+0 .. +149, +10030 .. +10034)."""
    bucket: str = DEFAULT_BUCKET
    """The S3 bucket created at start."""
    db: str = "sqlite"
    """Airflow's metadata database: `sqlite` (a file) or `postgres` (a PostgreSQL server of the stack's)."""
    schedules: bool = True
    """Whether Airflow starts DAG runs on their schedules (`checkpoint_audit` daily, `node_return` hourly).
    A test session turns this off: a scheduled run at a wall-clock boundary (the audit at midnight closes
    healthy incidents) would change records under a test. Triggered runs work either way."""
    preload_torch: bool = False
    """Whether Airflow's scheduler imports torch at its start, so every task it runs (a fork of it under
    LocalExecutor) finds torch already imported instead of importing it again (seconds per task on a busy
    machine; how and why: longrun/stack/scheduler_preload.py). Costs the scheduler torch's memory (shared
    copy-on-write with its workers and tasks). A test session turns this on."""
    job_user: str | None = None
    """The unprivileged Unix user the stack's jobs run as (longrun.stack.job_access creates it and hands it
    the run root; Airflow's workers submit as it). None: jobs run as the orchestrator's user, root, and can
    do whatever it does. `longrun stack up` and `make demo` use `longrun-job` (DEFAULT_JOB_USER) unless
    told `--job-user none` or LONGRUN_STACK_JOB_USER; a Stack made in code has none unless it asks."""

    def __post_init__(self) -> None:
        if not self.state_dir.is_absolute():
            raise ValueError(f"state_dir must be absolute, got {str(self.state_dir)!r}")
        if not 1024 <= self.port_base <= 65535 - 10200:
            raise ValueError(f"port_base must be in 1024..{65535 - 10200}, got {self.port_base!r}")
        if not _BUCKET_RE.match(self.bucket):
            raise ValueError(f"bucket must be a valid S3 bucket name (3-63 of a-z0-9.-), got {self.bucket!r}")
        if self.db not in DB_KINDS:
            raise ValueError(f"db must be one of {', '.join(DB_KINDS)}, got {self.db!r}")
        if not isinstance(self.schedules, bool):
            raise ValueError(f"schedules must be true or false, got {self.schedules!r}")
        if not isinstance(self.preload_torch, bool):
            raise ValueError(f"preload_torch must be true or false, got {self.preload_torch!r}")
        if self.job_user is not None:
            check_job_user(self.job_user)

    # Slurm
    @property
    def slurmctld_port(self) -> int:
        return self.port_base + 17

    def slurmd_port(self, node: str) -> int:
        return self.port_base + 18 + NODES.index(node)

    @property
    def srun_port_range(self) -> tuple[int, int]:
        """srun listens for its steps' I/O here; pinned so every port of ours lies in our range."""
        return self.port_base + 100, self.port_base + SLOT_WIDTH - 1

    # SeaweedFS (each also + 10000 for gRPC)
    @property
    def weed_ports(self) -> dict[str, int]:
        b = self.port_base
        return {
            "master": b + 30,
            "volume": b + 31,
            "filer": b + 32,
            "s3": b + 33,
            "admin": b + 34,
            "s3.iceberg": b + 36,
            "s3.lance": b + 37,
        }

    @property
    def s3_endpoint(self) -> str:
        return f"http://{HOST}:{self.weed_ports['s3']}"

    # Airflow
    @property
    def airflow_port(self) -> int:
        return self.port_base + 80

    @property
    def airflow_url(self) -> str:
        return f"http://{HOST}:{self.airflow_port}"

    @property
    def postgres_port(self) -> int:
        """Airflow's PostgreSQL (only with db=postgres)."""
        return self.port_base + 40

    def ports_of(self, component: str) -> list[int]:
        """Every TCP port `component` listens on by design (srun's range not included)."""
        if component == "slurm":
            return [self.slurmctld_port, *(self.slurmd_port(n) for n in NODES)]
        if component == "s3":
            grpc = [self.weed_ports[k] + 10000 for k in ("master", "volume", "filer", "s3", "admin")]
            return [*self.weed_ports.values(), *grpc]
        if component == "airflow":
            return [self.airflow_port, *([self.postgres_port] if self.db == "postgres" else [])]
        raise ValueError(f"component must be one of {', '.join(COMPONENTS)}, got {component!r}")

    def all_ports(self) -> list[int]:
        """Every TCP port the stack listens on by design (srun's range not included)."""
        return [p for c in COMPONENTS for p in self.ports_of(c)]

    def dir(self, component: str) -> Path:
        return self.state_dir / component

    @property
    def run_root(self) -> Path:
        """Run dirs of the jobs the stack's Airflow submits (LONGRUN_RUN_ROOT): inside the state dir, so two
        stacks on one machine never share one, however their runs are named."""
        return self.state_dir / "runs"

    def save(self) -> None:
        """Remember the port plan, so `status`/`env`/`down` of this state dir need no flags."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = {
            "port_base": self.port_base,
            "bucket": self.bucket,
            "db": self.db,
            "schedules": self.schedules,
            "preload_torch": self.preload_torch,
            "job_user": self.job_user,
        }
        (self.state_dir / "stack.json").write_text(json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(
        cls, state_dir: Path | None = None, *, default_job_user: str | None = None, **overrides: object
    ) -> Layout:
        """The layout saved in `state_dir`, else from the environment (`LONGRUN_PORT_BASE`,
        `LONGRUN_BUCKET`, `LONGRUN_DB`, `LONGRUN_STACK_JOB_USER`), else defaults (the job user:
        `default_job_user`, None unless the caller says, as `longrun stack up` does); explicit overrides
        that are not None win. A job user of `none` (NO_JOB_USER) means no job user."""
        state_dir = (state_dir or default_state_dir()).resolve()
        saved_path = state_dir / "stack.json"
        saved = json.loads(saved_path.read_text()) if saved_path.exists() else {}
        base = saved.get("port_base") or int(os.environ.get("LONGRUN_PORT_BASE", DEFAULT_PORT_BASE))
        bucket = saved.get("bucket") or os.environ.get("LONGRUN_BUCKET", DEFAULT_BUCKET)
        db = saved.get("db") or os.environ.get("LONGRUN_DB", "sqlite")
        kwargs: dict[str, object] = {
            "port_base": base,
            "bucket": bucket,
            "db": db,
            "schedules": saved.get("schedules", True),
            "preload_torch": saved.get("preload_torch", False),
            "job_user": saved["job_user"]
            if "job_user" in saved
            else os.environ.get("LONGRUN_STACK_JOB_USER", default_job_user),
        }
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        if kwargs["job_user"] in (NO_JOB_USER, ""):
            kwargs["job_user"] = None
        return cls(state_dir=state_dir, **kwargs)  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["state_dir"] = str(self.state_dir)
        return d
