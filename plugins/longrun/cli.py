"""The `longrun` command: dispatches to one subcommand module each, imported only when used."""

from __future__ import annotations

import importlib
import sys

# subcommand -> module with a `main(argv: list[str]) -> int`
SUBCOMMANDS = {
    "stack": "longrun.stack.cli",
    "checkpoints": "longrun.checkpoints.cli",
    "audit": "longrun.audit.cli",
    "records": "longrun.records",
    "nodes": "longrun.health.cli",
    "incidents": "longrun.incident.cli",
}
# Job-side subcommands: modules of package `training` (no Airflow, no `longrun` import), so a user's machine
# without the orchestrator runs them too (`python -m training.conformance`). Not pinned in docs/contracts.md.
JOB_SIDE_SUBCOMMANDS = {
    "entrypoint": "training.conformance",  # `longrun entrypoint check [options] -- <command...>`
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {**SUBCOMMANDS, **JOB_SIDE_SUBCOMMANDS}
    if not args or args[0] in ("-h", "--help"):
        print("usage: longrun {" + ",".join(commands) + "} ...", file=sys.stderr)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in commands:
        print(f"longrun: unknown command {name!r}; expected one of {', '.join(commands)}", file=sys.stderr)
        return 2
    module = importlib.import_module(commands[name])
    try:
        return int(module.main(rest) or 0)
    except BrokenPipeError:  # `longrun ... | head`: the reader left; that is not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
