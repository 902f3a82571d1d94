"""`longrun audit run|fetch`: the model-checkpoint audit from a shell, over the store the environment
names (`AWS_ENDPOINT_URL` + `LONGRUN_BUCKET`, else a local directory store).

    longrun audit run [--id ID] [--sample-size N] [--seed S]    audit now; report under audit/<ID>/
    longrun audit fetch --id ID --dest DIR                      copy a report (Data Docs, JSON) to DIR

Exit codes: 0 passed / fetched; 1 the audit failed (the message names each broken property); 2 bad usage
or a store that cannot be used.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from longrun.audit.config import AuditConfig, audit_id_from
from longrun.audit.run import AuditFailed, run_audit
from training.store.factory import store_from_env
from training.store.interface import ObjectStore, StoreError

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longrun audit", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("run", help="audit every run in the store (or the --run ones) now")
    sp.add_argument("--id", help="report id (default: cli-<UTC time>); the report goes under audit/<id>/")
    sp.add_argument("--sample-size", type=int, default=16, help="stored files to re-hash (default 16)")
    sp.add_argument("--seed", type=int, default=0, help="seed of the re-hash sample (default 0)")
    sp.add_argument("--loss-min", type=float, default=0.0, help="lowest loss a manifest may record")
    sp.add_argument("--loss-max", type=float, default=1.0e4, help="highest loss a manifest may record")
    sp.add_argument(
        "--run", action="append", default=[], help="audit only this run (repeat for more; default: every run)"
    )
    sp = sub.add_parser("fetch", help="copy an audit report (Data Docs, JSON, table) to a local directory")
    sp.add_argument("--id", required=True, help="report id (the audit/<id>/ prefix)")
    sp.add_argument("--dest", required=True, help="local directory to copy into")
    return p


def _run(store: ObjectStore, args: argparse.Namespace) -> int:
    audit_id = audit_id_from(args.id or time.strftime("cli-%Y%m%dT%H%M%SZ", time.gmtime()))
    cfg = AuditConfig(
        audit_id=audit_id,
        sample_size=args.sample_size,
        seed=args.seed,
        loss_min=args.loss_min,
        loss_max=args.loss_max,
        runs=tuple(args.run),
    )
    try:
        report = run_audit(store, cfg)
    except AuditFailed as e:
        print(str(e), file=sys.stderr)
        return EXIT_FAILED
    print(
        f"model checkpoint audit {audit_id} passed: {report.rows} rows {report.counts}, {report.rehashed} re-hashed"
    )
    print(f"Data Docs: {report.docs_url} (store key {report.keys['docs']})")
    return EXIT_OK


def _fetch(store: ObjectStore, args: argparse.Namespace) -> int:
    prefix = f"audit/{audit_id_from(args.id)}/"
    dest = Path(args.dest)
    count = 0
    for info in store.list(prefix):
        target = dest / info.key[len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        store.download(info.key, target)
        count += 1
    if not count:
        print(f"longrun audit: no report under {prefix} in {store.describe()}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{count} files from {prefix} -> {dest}; open {dest / 'docs' / 'index.html'}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        store = store_from_env()
        return {"run": _run, "fetch": _fetch}[args.command](store, args)
    except (StoreError, ValueError) as e:
        print(f"longrun audit: {e}", file=sys.stderr)
        return EXIT_ERROR
