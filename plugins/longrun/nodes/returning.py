"""The steps of `node_return`, as plain functions over a store and a Slurm client (no Airflow here).

    select   which nodes may be tried: drained by longrun, not `diag-fail`, not a repeat offender
             (a refused node gets a `return_refused` event, a repeat offender a replacement mark)
    probe    node_check (replay probe, + DCGM where present) `repeats` times, each round in a MAINT
             reservation through longrun.health.diagnose; the first unclean round stops, the node stays
             drained with that verdict, and a failure marks it for replacement
    resume   only a node whose every round passed, which still carries longrun's diag-pass reason

A node is resumed by nothing else in longrun. Every decision leaves a node-history event.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from longrun.health import dcgm, diagnose, node_check
from longrun.health import history as h
from longrun.health.policy import NodePolicy, standing
from longrun.health.probe_reference import checked_reference, comparable, remember_reference
from longrun.nodes.outcome import NodeProbe, NodeReturn
from longrun.slurm import validate as v
from longrun.slurm.client import SlurmClient
from training.records.alert import AlertRef
from training.records.diagnosis import ProbeResult
from training.store.interface import ObjectStore

PASS_KIND = f"{diagnose.DIAG}-{node_check.PASS}"


def drain_origin(reason: str | None) -> tuple[str, str, int]:
    """(kind, run, step) of longrun's reason on the node; ('?', 'return', 0) if it has no run and step."""
    return diagnose.parse_reason(reason) or ("?", "return", 0)


def refusal(client: SlurmClient, hist: ObjectStore, node: str, policy: NodePolicy) -> str | None:
    """Why `node` must not be tried for a return, or None."""
    st = client.node(node)
    if not st.drain_flag:
        return f"{node} is not drained (state {st.state}): nothing to return"
    if not st.is_ours:
        return (
            f"{node} is drained by someone else (reason {st.reason!r}): longrun returns only its own drains"
        )
    kind = drain_origin(st.reason)[0]
    if kind == f"{diagnose.DIAG}-{node_check.FAIL}":
        return f"{node}'s last diagnostic failed ({st.reason}): it goes to the vendor, not back to service"
    s = standing(node, h.events(hist, node), policy)
    if s.repeat_offender:
        return f"{node} is marked for replacement ({s.headline}): {s.why}"
    return None


def select(
    client: SlurmClient, hist: ObjectStore, *, requested: Sequence[str], policy: NodePolicy, source: str
) -> dict[str, Any]:
    """The nodes to probe. None requested: the `diag-pass` nodes, if the policy allows automatic returns."""
    if requested:
        candidates = [v.node("node", n) for n in requested]
    elif policy.auto_return:
        candidates = [
            n.name
            for n in client.nodes()
            if n.drain_flag and n.is_ours and drain_origin(n.reason)[0] == PASS_KIND
        ]
    else:
        candidates = []
    chosen, refused = [], {}
    for node in candidates:
        why = refusal(client, hist, node, policy)
        if why is None:
            chosen.append(node)
            continue
        refused[node] = why
        h.record(hist, node, h.RETURN_REFUSED, source, reason=why)
        if "marked for replacement" in why or "diagnostic failed" in why:
            h.record(hist, node, h.REPLACE, source, reason=why)
    return {"nodes": chosen, "refused": refused}


def _reference(
    store: ObjectStore,
    client: SlurmClient,
    *,
    node: str,
    partition: str,
    state_dir: str | None,
    python: str | None,
) -> dict[str, Any]:
    # Always computed now, never read back from the store: a node returns to service only on a comparison
    # with a reference run on a healthy node (a stored one could be forged; docs/reliability.md).
    healthy = diagnose.pick_healthy(client.nodes(), exclude=[node])
    if healthy is None:
        raise RuntimeError(f"no healthy idle node to compute the probe's reference on; {node} stays drained")
    ref = diagnose.reference(client, node=healthy, python=python, state_dir=state_dir)
    if checked_reference(ref, suspect=node) is None:
        raise RuntimeError(f"the reference probe on {healthy} gave no usable reference; {node} stays drained")
    remember_reference(store, partition, ref)
    return ref


def dcgm_level(evs: Sequence[h.NodeEvent]) -> int:
    """The history's call: the last suspicion's check; a node suspected before gets the long suite."""
    suspicions = [e for e in evs if e.kind == h.SUSPECTED]
    check = str(AlertRef.from_json(suspicions[-1].evidence).check) if suspicions else "recompute"
    return dcgm.level_for(check=check, prior_incidents=max(0, len(suspicions) - 1))


def probe(
    store: ObjectStore,
    hist: ObjectStore,
    client: SlurmClient,
    *,
    node: str,
    repeats: int,
    source: str,
    partition: str = "default",
    state_dir: str | None = None,
    python: str | None = None,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Diagnose `node` up to `repeats` times; {'node', 'clean', 'rounds': [...]}."""
    ref = _reference(store, client, node=node, partition=partition, state_dir=state_dir, python=python)
    level = dcgm_level(h.events(hist, node))
    _, run, step = drain_origin(client.node(node).reason)
    known = ProbeResult.from_json(ref)
    rounds: list[dict[str, Any]] = []
    for i in range(repeats):
        d = diagnose.diagnose(
            client,
            node=node,
            run=run,
            step=step,
            expect=str(ref["fingerprint"]),
            dcgm_level=level,
            timeout_s=timeout_s,
            python=python,
            state_dir=state_dir,
            known=known,  # a pass only on a real match (diagnose.checked_verdict)
        )
        res = {**d.to_dict(), "dcgm_level": level, "round": i + 1}
        probe_res = (d.details.get("probe") or {}).get("result") or {}
        if d.verdict == node_check.FAIL and probe_res and not comparable(known, probe_res):
            res["verdict"] = node_check.ERROR  # other software or CPU level: not comparable, not a verdict
        h.record(
            hist,
            node,
            h.DIAGNOSED,
            f"{source}.r{i + 1}",
            run=run,
            verdict=res["verdict"],
            reason=d.reason,
            evidence={**h.probe_evidence(res), "round": i + 1, "of": repeats},
        )
        rounds.append({k: res[k] for k in ("round", "verdict", "summary", "reason")})
        if res["verdict"] != node_check.PASS:
            if res["verdict"] == node_check.FAIL:
                h.record(hist, node, h.REPLACE, source, reason=f"round {i + 1} of node_return failed")
            break
    clean = len(rounds) == repeats and all(r["verdict"] == node_check.PASS for r in rounds)
    return NodeProbe(node=node, clean=clean, rounds=tuple(rounds), dcgm_level=level).to_json()


def resume(
    client: SlurmClient,
    hist: ObjectStore,
    *,
    probed: Mapping[str, Any],
    source: str,
    act: bool,
    policy: NodePolicy,
) -> dict[str, Any]:
    """Resume a cleanly probed node (act), or record that it would be (observe). Re-checks Slurm first:
    the node must still carry longrun's diag-pass reason and the history must still allow it."""
    p = NodeProbe.from_json(probed)
    node = p.node
    if not p.clean:
        dirty = p.why or f"not every round passed: {[r['verdict'] for r in p.rounds]}"
        h.record(hist, node, h.RETURN_REFUSED, source, reason=dirty)
        return NodeReturn(node=node, returned=False, why=dirty).to_json()
    st = client.node(node)
    why = refusal(client, hist, node, policy)
    if why is None and drain_origin(st.reason)[0] != PASS_KIND:
        why = f"{node}'s reason is {st.reason!r}, not longrun's diag-pass"
    if why is not None:
        h.record(hist, node, h.RETURN_REFUSED, source, reason=why)
        return NodeReturn(node=node, returned=False, why=why).to_json()
    evidence = {"rounds": list(p.rounds), "previous_reason": st.reason}
    if not act:
        h.record(hist, node, h.WOULD_RETURN, source, reason=st.reason, evidence=evidence)
        return NodeReturn(node=node, returned=False, observe=True).to_json()
    client.resume(node)
    h.record(hist, node, h.RETURNED, source, reason=st.reason, evidence={**evidence, "time": time.time()})
    return NodeReturn(node=node, returned=True).to_json()
