"""`longrun records runs|list|show`: read the run records in the store from a shell.

For runbooks and operators: which alerts, incidents, validations, suspect marks and progress records a
run has, and the content of one. Read-only. The store is the one the environment names
(`AWS_ENDPOINT_URL` + `LONGRUN_BUCKET`, else a local directory), as for `longrun checkpoints`.
Exit codes: 0 found; 1 nothing found; 2 bad usage or a store that cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys

from longrun.runview import FAMILIES, list_runs
from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import NotFound, StoreError

# record family -> its folder (or file) under the run: the read model's layout
KINDS = FAMILIES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longrun records", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("runs", help="the runs that have records in the store")
    sp = sub.add_parser("list", help="the record keys of one run, newest last")
    sp.add_argument("--run", required=True, help="run name")
    sp.add_argument("--kind", choices=sorted(KINDS), help="only this family of records")
    sp = sub.add_parser("show", help="print one record as JSON")
    sp.add_argument("--key", help="full store key (as `list` prints it)")
    sp.add_argument("--run", help="run name (with --kind: the newest record of that family)")
    sp.add_argument("--kind", choices=sorted(KINDS), help="record family (with --run)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        store = store_from_env()
        if args.command == "runs":
            runs = list_runs(store)
            print("\n".join(runs) if runs else "no runs in " + store.describe())
            return 0 if runs else 1
        if args.command == "list":
            prefix = schema.store_key(args.run, KINDS[args.kind] if args.kind else "")
            keys = [i.key for i in store.list(prefix)]
            print("\n".join(keys) if keys else f"no records under {prefix} in {store.describe()}")
            return 0 if keys else 1
        if args.key:
            key = args.key
        elif args.run and args.kind:
            prefix = schema.store_key(args.run, KINDS[args.kind])
            # Records lie directly in their folder; deeper keys are attachments (an incident's plots).
            keys = [i.key for i in store.list(prefix) if "/" not in i.key[len(prefix) :]]
            if not keys:
                print(f"no {args.kind} records for run {args.run} in {store.describe()}", file=sys.stderr)
                return 1
            key = keys[-1]  # keys sort by step / sequence, so the last is the newest
        else:
            print("longrun records show: give --key, or --run with --kind", file=sys.stderr)
            return 2
        data = store.get_bytes(key)
        try:
            print(json.dumps(json.loads(data), indent=2, sort_keys=True))
        except ValueError:
            print(data.decode(errors="replace"))  # JSONL check batches and other text
        return 0
    except NotFound as e:
        print(f"longrun records: {e}", file=sys.stderr)
        return 1
    except (StoreError, schema.SchemaError) as e:
        print(f"longrun records: {e}", file=sys.stderr)
        return 2
