"""`longrun incidents list|close`: see which incidents are open, and close one with a reason.

    list  --run NAME                                   id, status, open/closed, alert
    close --run NAME --incident ID --reason TEXT [--by NAME]

Closing lets retention free the checkpoints the incident held, and closing a drill's incident ends the
drill (its sick-node marker removed; the line after the closing says so). Incidents that relaunched and
stayed healthy close by themselves (checkpoint_audit). Exit codes: 0 done; 1 nothing found; 2 bad usage or store.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from longrun.checkpoints import catalog
from longrun.checkpoints.retention import CLOSED_STATUSES
from longrun.incident import closing
from longrun.incident.events import Event
from training.records import schema
from training.records.alert import Alert
from training.records.orchestrator import Incident as IncidentRecord
from training.store.factory import store_from_env
from training.store.interface import NotFound, StoreError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longrun incidents", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("list", help="the run's incidents, open and closed")
    sp.add_argument("--run", required=True, help="run name")
    sp = sub.add_parser("close", help="close an incident (an operator's decision, with a reason)")
    sp.add_argument("--run", required=True, help="run name")
    sp.add_argument("--incident", required=True, help="incident id (as `list` prints it)")
    sp.add_argument("--reason", required=True, help="why it is closed (kept in the record)")
    sp.add_argument("--by", default=None, help="who closes it (default: the login name)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        store = store_from_env()
        schema.check_run_name(args.run)
        if args.command == "list":
            incs = catalog.incidents(store, args.run)
            if not incs:
                print(f"no incidents for run {args.run} in {store.describe()}", file=sys.stderr)
                return 1
            for _key, rec in incs:
                state = "closed" if rec.status in CLOSED_STATUSES else "open"
                alert = Alert.from_json(rec.alert)
                print(
                    f"{rec.incident_id}  {state}  status={rec.status}  "
                    f"{alert.check}@{alert.step}  nodes={list(alert.suspect_nodes)}"
                )
            return 0
        closed = IncidentRecord.from_json(
            closing.close(
                store,
                run=args.run,
                incident_id=args.incident,
                by=args.by or getpass.getuser(),
                reason=args.reason,
            )
        )
        why = closed.closed.reason
        print(f"incident {closed.incident_id} of run {args.run}: {closed.status} ({why})")
        if (drill := closed.event(Event.DRILL_ENDED)) is not None:
            print(f"drill {drill.details.get('drill')} ended: {drill.details.get('state')}")
        return 0
    except (NotFound, FileNotFoundError) as e:
        print(f"longrun incidents: {e}", file=sys.stderr)
        return 1
    except (StoreError, ValueError, schema.SchemaError) as e:
        print(f"longrun incidents: {e}", file=sys.stderr)
        return 2
