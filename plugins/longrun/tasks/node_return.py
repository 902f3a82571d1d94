"""node_return's @task bodies (and the node policy Variable): Airflow in, `returning` does the work."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.sdk import Variable
from airflow.sdk.exceptions import AirflowFailException

from longrun.health import history
from longrun.health.policy import POLICY_VARIABLE, NodePolicy
from longrun.hooks.slurm import SlurmHook
from longrun.incident import drill_state, modes
from longrun.monitor import lifecycle
from longrun.nodes import returning
from longrun.nodes.outcome import NodeProbe, NodeReturn
from training.store.factory import store_from_env
from training.store.interface import ObjectStore

log = logging.getLogger("longrun.node_return")


def history_store() -> ObjectStore:
    return history.history_store()


def node_policy() -> NodePolicy:
    raw = Variable.get(POLICY_VARIABLE, default=None, deserialize_json=True)
    try:
        return NodePolicy.from_json(raw)
    except (TypeError, ValueError) as e:
        raise AirflowFailException(f"Variable {POLICY_VARIABLE}: {e}") from None


def _source(dag_run_id: str) -> str:
    return history.source_id(f"node_return.{dag_run_id}")


def select_task(params: Mapping[str, Any], dag_run_id: str) -> dict[str, Any]:
    mode = str(params.get("mode") or modes.ACT)
    modes.plan(mode)
    policy = node_policy()
    requested = [params["node"]] if params.get("node") else []
    out = returning.select(
        SlurmHook().client, history_store(), requested=requested, policy=policy, source=_source(dag_run_id)
    )
    repeats = int(params.get("repeats") or policy.probe_repeats)
    for node, why in out["refused"].items():
        log.warning("not returning %s: %s (runbook: runbooks/repeat-offender.md)", node, why)
    return {**out, "mode": mode, "repeats": repeats, "requested": requested}


def probe_task(selected: Mapping[str, Any], dag_run_id: str) -> list[dict[str, Any]]:
    client = SlurmHook().client
    results = []
    for node in selected["nodes"]:
        if not modes.plan(selected["mode"]).changes:
            results.append(NodeProbe(node=node, clean=True, observe=True).to_json())
            continue
        _, run, _ = returning.drain_origin(client.node(node).reason)
        spec = lifecycle.spec_from_params({"run_name": run if run != "return" else "node-return"})
        store = store_from_env()
        try:
            res = returning.probe(
                store,
                history_store(),
                client,
                node=node,
                repeats=int(selected["repeats"]),
                source=_source(dag_run_id),
                partition=spec.partition,
                # the run's fault state only in an operator's sick-node drill on this node (drill_state)
                state_dir=drill_state.for_return(store, run=spec.run_name, node=node),
            )
        except RuntimeError as e:
            res = NodeProbe(node=node, clean=False, why=str(e)).to_json()
        log.info("%s: %s", node, res)
        results.append(res)
    return results


def resume_task(
    selected: Mapping[str, Any], probed: list[dict[str, Any]], dag_run_id: str
) -> list[dict[str, Any]]:
    act = modes.plan(selected["mode"]).changes
    policy = node_policy()
    client = SlurmHook().client
    return [
        returning.resume(
            client, history_store(), probed=p, source=_source(dag_run_id), act=act, policy=policy
        )
        for p in probed
    ]


def rejection(approval: Any, skipped: Any = None) -> str | None:
    """Why `approve_return` stopped the return, from its XComs (None: not asked, or approved). A Reject
    shows as the skip record naming `resume` (Airflow's ApprovalOperator pushes no return value then), or
    as a returned answer."""
    if isinstance(approval, Mapping) and list(approval.get("chosen_options") or []) == ["Reject"]:
        who = approval.get("responded_by_user")
        if isinstance(who, Mapping):
            who = who.get("name") or who.get("id")
        return f"a person ({who or 'unknown'}) rejected the return at approve_return"
    if isinstance(skipped, Mapping) and "resume" in list(skipped.get("skipped") or []):
        return "a person rejected the return at approve_return (the approval form says who and when)"
    return None


def summary_task(
    selected: Mapping[str, Any],
    resumed: list[dict[str, Any]] | None,
    *,
    probed: list[dict[str, Any]] | None = None,
    approval: Any = None,
    skipped: Any = None,
    dag_run_id: str = "unknown",
) -> dict[str, Any]:
    """Fails the DAG run when a node the operator asked for was not returned (the log says why). A
    rejected approval skipped `resume`: the nodes stay drained and their history records the rejection."""
    resumed = resumed or []
    done = {r.node: r for r in map(NodeReturn.from_json, resumed)}
    rejected = rejection(approval, skipped) if selected.get("mode") == modes.APPROVE and not resumed else None
    if rejected:
        hist = history_store()
        for p in map(NodeProbe.from_json, probed or []):
            why = rejected if p.clean else f"{rejected}; the probe was not clean either"
            history.record(
                hist,
                p.node,
                history.RETURN_REFUSED,
                _source(dag_run_id),
                reason=why,
                evidence={"rounds": list(p.rounds)},
            )
            done[p.node] = NodeReturn(node=p.node, returned=False, why=why)
    missing: dict[str, str] = {}
    for n in selected["requested"]:
        r = done.get(n)
        if r is None or not (r.returned or r.observe):
            missing[n] = selected["refused"].get(n) or (r.why if r else None) or "not probed"
    out = {"returned": [n for n, r in done.items() if r.returned], "not_returned": missing}
    log.info("node_return: %s", out)
    if missing:
        raise AirflowFailException(
            f"not returned: {missing}; the node(s) stay drained. Runbooks: runbooks/node-return.md,"
            " runbooks/repeat-offender.md"
        )
    return out
