"""`longrun stack up|down|status|env`."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from .layout import COMPONENTS, DB_KINDS, DEFAULT_JOB_USER, NO_JOB_USER
from .procs import StackError
from .stack import Stack

# The variables `env` always prints, in this order (docs/contracts.md); others follow.
ENV_ORDER = (
    "SLURM_CONF",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "LONGRUN_BUCKET",
    "LONGRUN_AIRFLOW_URL",
    "LONGRUN_AIRFLOW_USER",
    "LONGRUN_AIRFLOW_PASSWORD",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longrun stack", description=__doc__)
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="state directory (default: $LONGRUN_STATE_DIR, else <repo>/.state/stack)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("up", "start (reuses what already runs)"), ("down", "stop what up started")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument(
            "--only",
            default=None,
            help=f"comma-separated subset of {','.join(COMPONENTS)} (default: all)",
        )
        if name == "up":
            sp.add_argument(
                "--db",
                choices=DB_KINDS,
                default=None,
                help="Airflow's metadata database: sqlite (default) or postgres (a PostgreSQL server the"
                " stack starts and stops, 127.0.0.1 only); remembered in the state dir",
            )
            sp.add_argument(
                "--job-user",
                default=None,
                help=f"the unprivileged Unix user jobs run as, created when missing (default:"
                f" {DEFAULT_JOB_USER}, or $LONGRUN_STACK_JOB_USER); `{NO_JOB_USER}` runs jobs as the"
                " orchestrator's user (no isolation); remembered in the state dir",
            )
    sub.add_parser("status", help="each recorded process with PID and health; rc 1 if one is dead")
    sub.add_parser("env", help='print export lines for a shell: eval "$(longrun stack env)"')
    return p


def format_env(env: dict[str, str]) -> str:
    keys = [k for k in ENV_ORDER if k in env] + sorted(k for k in env if k not in ENV_ORDER)
    return "".join(f"export {k}={shlex.quote(env[k])}\n" for k in keys)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        stack = Stack(
            args.state_dir,
            db=getattr(args, "db", None),
            job_user=getattr(args, "job_user", None),
            default_job_user=DEFAULT_JOB_USER if args.command == "up" else None,
        )
        if args.command == "up":
            t0 = time.monotonic()
            print(f"state dir: {stack.state_dir}", flush=True)
            stack.up(args.only, say=lambda line: print(line, flush=True))
            print(f'stack up ({time.monotonic() - t0:.1f} s); for a shell: eval "$(longrun stack env)"')
        elif args.command == "down":
            stack.down(args.only, say=lambda line: print(line, flush=True))
            print("stack down")
        elif args.command == "status":
            rows = stack.status()
            if not rows:
                print(f"nothing recorded in {stack.state_dir}")
                return 0
            for st in rows:
                mark = "ok  " if st.healthy else ("SICK" if st.alive else "DEAD")
                print(f"{mark} {st.component:8} {st.name:14} pid {st.pid:<8} {st.detail}")
            return 0 if all(st.alive for st in rows) else 1
        elif args.command == "env":
            sys.stdout.write(format_env(stack.env()))
    except (StackError, ValueError) as exc:
        print(f"longrun stack {args.command}: {exc}", file=sys.stderr)
        if args.command == "up":
            print(
                "what did start keeps running: `longrun stack status`, `longrun stack down`", file=sys.stderr
            )
        return 1
    return 0
