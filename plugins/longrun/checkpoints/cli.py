"""`longrun checkpoints list|validate|promote|demote|pick|retention --run NAME ...` over the store the
environment names (`AWS_ENDPOINT_URL` + `LONGRUN_BUCKET`, else a local directory store).

Exit codes: 0 done; 1 a negative answer (validation failed, promotion refused or lost a race, nothing to
pick); 2 bad usage or a store that cannot be used (one line naming the store and what to check).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from typing import Any

from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import (
    ObjectStore,
    StoreAuthError,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
)

EXIT_OK, EXIT_NO, EXIT_ERROR = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longrun checkpoints", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--run", required=True, help="run name")
        sp.add_argument("--json", action="store_true", help="print one JSON object (for machines)")
        return sp

    add("list", "checkpoints of a run, their validation, promotion and suspect state, and problems")
    sp = add("validate", "validate a checkpoint and record the result")
    sp.add_argument("--step", type=int, help="checkpoint step (default: every checkpoint not yet validated)")
    sp = add("promote", "validate-gated promotion by conditional write")
    sp.add_argument("--step", type=int, required=True, help="checkpoint step")
    sp = add("demote", "mark checkpoints after the last known-good step suspect")
    sp.add_argument("--after-step", type=int, required=True, help="last known-good step")
    sp.add_argument("--reason", required=True, help="why (an incident id, an alert)")
    sp.add_argument("--incident", help="incident id (makes the mark idempotent)")
    sp = add("pick", "the pre-incident checkpoint for an alert, and why")
    sp.add_argument("--alert", help="store key of the alert record (default: the run's newest alert)")
    sp.add_argument("--check", choices=sorted(schema.CHECKS_FOR_ALERT), help="alert check (with --step)")
    sp.add_argument("--step", type=int, help="alert step (with --check)")
    sp.add_argument("--no-write", action="store_true", help="do not record the pick")
    sp = add("retention", "keep the last K promoted and what open incidents need; delete the rest")
    sp.add_argument("--keep", type=int, required=True, help="promoted checkpoints to keep")
    sp.add_argument("--dry-run", action="store_true", help="print the plan, delete nothing")
    return p


def _emit(args: argparse.Namespace, obj: Any, text: str) -> None:
    print(json.dumps(obj, sort_keys=True, default=str) if args.json else text)


def _list(store: ObjectStore, args: argparse.Namespace) -> int:
    from longrun.checkpoints import catalog

    cat = catalog.checkpoints(store, args.run)
    promoted = set(catalog.promoted_steps(store, args.run))
    cur = catalog.current_pointer(store, args.run)
    marks = catalog.suspect_marks(store, args.run)
    unreadable: list[catalog.Problem] = []
    latest: dict[int, bool] = {}
    for _key, v in catalog.validations(store, args.run, problems=unreadable):
        latest[v.step] = v.ok
    for p in unreadable:  # it may be the newest: the gate refuses, so it shows as not passing
        if m := re.search(r"validations/step-(\d{8})-", p.key):
            latest[int(m.group(1))] = False
    rows = []
    for c in cat.checkpoints:
        rows.append(
            {
                "step": c.step,
                "key": c.prefix,
                "validated": latest.get(c.step),
                "promoted": c.step in promoted,
                "current": cur is not None and cur[0].step == c.step,
                "suspect": catalog.demoting_mark(marks, c.step, c.manifest.time) is not None,
                "loss": c.manifest.loss,
                "bytes": sum(f["size"] for f in c.manifest.files),
            }
        )
    problems = [{"key": p.key, "error": p.error} for p in [*cat.problems, *unreadable]]
    lines = [f"{'step':>10}  {'valid':5}  {'promoted':8}  {'suspect':7}  bytes"]
    for r in rows:
        valid = {None: "-", True: "ok", False: "FAIL"}[r["validated"]]
        prom = "current" if r["current"] else "yes" if r["promoted"] else "-"
        lines.append(
            f"{r['step']:>10}  {valid:5}  {prom:8}  {'yes' if r['suspect'] else '-':7}  {r['bytes']}"
        )
    lines += [f"problem: {p['key']}: {p['error']}" for p in problems]
    _emit(args, {"run": args.run, "checkpoints": rows, "problems": problems}, "\n".join(lines))
    return EXIT_OK


def _validate(store: ObjectStore, args: argparse.Namespace) -> int:
    from longrun.checkpoints import catalog
    from longrun.checkpoints.validate import validate

    if args.step is not None:
        steps = [args.step]
    else:
        done = {v.step for _key, v in catalog.validations(store, args.run, problems=[])}
        steps = [c.step for c in catalog.checkpoints(store, args.run).checkpoints if c.step not in done]
    recs = [validate(store, args.run, s) for s in steps]
    lines = []
    for r in recs:
        lines.append(
            f"step {r['step']}: {'ok' if r['ok'] else 'FAILED'} ({r['bytes']} bytes, {r['duration_s']:.2f}s)"
        )
        lines += [f"  error: {e}" for e in r["errors"]]
    _emit(args, {"run": args.run, "validations": recs}, "\n".join(lines) or "nothing to validate")
    return EXIT_OK if all(r["ok"] for r in recs) else EXIT_NO


def _promote(store: ObjectStore, args: argparse.Namespace) -> int:
    from longrun.checkpoints.promote import PromotionConflict, PromotionRefused, promote

    try:
        rec = promote(store, args.run, args.step, by="cli")
    except (PromotionRefused, PromotionConflict) as e:
        _emit(
            args,
            {"run": args.run, "step": args.step, "promoted": False, "error": str(e)},
            f"not promoted: {e}",
        )
        return EXIT_NO
    _emit(
        args, {**rec, "promoted": True}, f"promoted step {rec['step']} of run {args.run} (seq {rec['seq']})"
    )
    return EXIT_OK


def _demote(store: ObjectStore, args: argparse.Namespace) -> int:
    from longrun.checkpoints.promote import mark_suspect

    rec = mark_suspect(store, args.run, args.after_step, args.reason, incident_id=args.incident)
    _emit(
        args,
        rec,
        f"checkpoints of run {args.run} after step {args.after_step} are suspect; pointer {rec['pointer']}",
    )
    return EXIT_OK


def _pick(store: ObjectStore, args: argparse.Namespace) -> int:
    from longrun.checkpoints import catalog
    from longrun.checkpoints.pick import pick_pre_incident

    if (args.check is None) != (args.step is None):
        raise _Usage("pick: give --check and --step together (or --alert, or neither for the newest alert)")
    if args.check is not None:
        alert: dict[str, Any] = {"check": args.check, "step": args.step, "suspect_nodes": []}
    elif args.alert:
        alert = json.loads(store.get_bytes(args.alert))
    else:
        found = catalog.alerts(store, args.run)
        if not found:
            raise _Usage(f"pick: run {args.run} has no alert records; give --check and --step")
        alert = found[-1][1].to_json()
    step, why = pick_pre_incident(store, args.run, alert, write=not args.no_write)
    key = schema.store_key(args.run, schema.checkpoint_dir(step)) if step is not None else None
    _emit(args, {"run": args.run, "step": step, "key": key, "why": why}, f"pick: {key or 'none'}\nwhy: {why}")
    return EXIT_OK if step is not None else EXIT_NO


def _retention(store: ObjectStore, args: argparse.Namespace) -> int:
    from longrun.checkpoints.retention import apply_retention

    plan = apply_retention(store, args.run, keep=args.keep, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    lines = [f"keep step {s}: {why}" for s, why in sorted(plan["keep"].items())]
    lines += [f"{verb} step {s}" for s in plan["delete"]]
    lines += [f"{verb} incomplete {p}" for p in plan["incomplete"]]
    lines += [f"left alone (manifest does not parse): {k}" for k in plan["unparsable"]]
    _emit(args, {"run": args.run, "dry_run": args.dry_run, **plan}, "\n".join(lines))
    return EXIT_OK


class _Usage(Exception):
    pass


COMMANDS = {
    "list": _list,
    "validate": _validate,
    "promote": _promote,
    "demote": _demote,
    "pick": _pick,
    "retention": _retention,
}


def main(argv: list[str] | None = None) -> int:
    # torch (validate) imports pynvml, which warns on every start; that line is noise for a CLI user.
    warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    store: ObjectStore | None = None
    try:
        schema.check_run_name(args.run)
        store = store_from_env()
        return COMMANDS[args.command](store, args)
    except (_Usage, schema.SchemaError) as e:
        print(f"longrun checkpoints: {e}", file=sys.stderr)
        return EXIT_ERROR
    except StoreAuthError as e:
        print(f"longrun checkpoints: credentials rejected: {e}", file=sys.stderr)
        return EXIT_ERROR
    except StoreUnavailable as e:
        print(
            f"longrun checkpoints: store unreachable: {e} (is the endpoint up? `longrun stack status`)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except StoreConfigError as e:
        print(f"longrun checkpoints: store misconfigured: {e}", file=sys.stderr)
        return EXIT_ERROR
    except StoreError as e:
        where = store.describe() if store is not None else "the store"
        print(f"longrun checkpoints: {where}: {e}", file=sys.stderr)
        return EXIT_ERROR
