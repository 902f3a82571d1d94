"""`longrun nodes list|show NODE`: the node history in the store, from a shell.

    list          every node with a history: its state by the history, events, suspicions
    show NODE     the node's timeline, oldest first (`--json`: the records themselves)

Read-only. The store is the one the environment names, as for `longrun records`.
Exit codes: 0 found; 1 nothing found; 2 bad usage or a store that cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from longrun.health import history as h
from longrun.health.policy import NodePolicy, standing
from training.records.diagnosis import ProbeResult
from training.store.interface import StoreError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longrun nodes", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the nodes with a history")
    sp = sub.add_parser("show", help="one node's timeline")
    sp.add_argument("node", help="Slurm node name")
    sp.add_argument("--json", action="store_true", help="print the records as JSON lines")
    return p


def timeline_line(e: h.NodeEvent) -> str:
    """One line per event; the UI node page shows the same fields."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.time))
    parts = [when, e.kind]
    if e.verdict:
        parts.append(e.verdict)
    if e.run:
        parts.append(f"run={e.run}")
    if e.incident_id:
        parts.append(f"incident={e.incident_id}")
    parts.append(f"source={e.source}")
    if e.reason:
        parts.append(f"reason={e.reason}")
    probe = ProbeResult.shown(e.evidence)  # a diagnosed event keeps the probe's fingerprints
    if probe.fingerprint:
        parts.append(f"fingerprint={probe.fingerprint} expected={probe.expected}")
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        store = h.history_store()
        if args.command == "list":
            names = h.nodes(store)
            if not names:
                print(f"no node history in {store.describe()}", file=sys.stderr)
                return 1
            for name in names:
                evs = h.events(store, name)
                st = standing(name, evs, NodePolicy())
                print(
                    f"{name}  state={h.state(evs)}  events={len(evs)}  suspicions={st.suspicions_in_window}"
                )
            return 0
        evs = h.events(store, args.node)
        if not evs:
            print(f"no history for node {args.node} in {store.describe()}", file=sys.stderr)
            return 1
        if args.json:
            for e in evs:
                print(json.dumps(e.to_json(), sort_keys=True))
            return 0
        st = standing(args.node, evs, NodePolicy())
        print(f"node {args.node}: state {h.state(evs)}; {st.why}")
        for e in evs:
            print(timeline_line(e))
        return 0
    except (StoreError, ValueError) as e:
        print(f"longrun nodes: {e}", file=sys.stderr)
        return 2
