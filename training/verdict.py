"""What happens when a check reaches a verdict: the alert first, durably; then the hook; then exit 93.

Order matters because the orchestrator acts after this process is gone: (1) one rank (the lowest rank
that is not a suspect: every rank holds the same evidence) writes the alert record to the run dir with
fsync and to the store; (2) a bounded barrier, so no rank exits before the alert is durable and no rank
hangs if a peer is already gone; (3) `on_verdict` on every rank (the NVRx integration asks ft_launcher
not to restart the workload here); (4) the caller exits with EXIT_SDC_VERDICT.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

import torch.distributed as dist

from training.checks.base import CheckResult
from training.events import EventWriter
from training.records import schema

log = logging.getLogger("training.verdict")

BARRIER_TIMEOUT_S = 60.0


def alert_record(
    result: CheckResult, *, run: str, nodes: list[str], context: dict[str, Any]
) -> dict[str, Any]:
    suspects = sorted(result.suspect_ranks)
    evidence = dict(result.evidence)
    evidence.setdefault("world", {"world_size": len(nodes), "nodes": nodes})
    return schema.record(
        "alert",
        run=run,
        step=result.step,
        check=result.check,
        suspect_ranks=suspects,
        suspect_nodes=sorted({nodes[r] for r in suspects}),
        evidence=evidence,
        update_applied=result.check == "weight_vote",
        exit_code=schema.EXIT_SDC_VERDICT,
        **context,
    )


def alert_writer_rank(suspects: list[int], world_size: int) -> int:
    """The lowest rank that is not a suspect (rank 0 if every rank is one)."""
    return next((r for r in range(world_size) if r not in suspects), 0)


def on_verdict(alert: dict[str, Any], *, rank: int) -> None:
    """Hook, called on every rank after the alert is durable and before the exit.

    The NVRx integration adds here the ft_launcher workload-control request (0.4.1:
    `WorkloadAction.ShutdownWorkload`) so the launcher does not restart the ranks in place."""
    log.error(
        "SDC verdict at step %d by check %s: suspects ranks %s nodes %s; exiting with %d",
        alert["step"],
        alert["check"],
        alert["suspect_ranks"],
        alert["suspect_nodes"],
        schema.EXIT_SDC_VERDICT,
    )


def publish_verdict(
    result: CheckResult,
    *,
    run: str,
    rank: int,
    nodes: list[str],
    events: EventWriter,
    context: dict[str, Any],
) -> dict[str, Any]:
    """Steps (1)-(3) above. Returns the alert record."""
    alert = alert_record(result, run=run, nodes=nodes, context=context)
    if rank == alert_writer_rank(alert["suspect_ranks"], len(nodes)):
        events.alert(alert)
    if dist.is_initialized() and dist.get_world_size() > 1:
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=BARRIER_TIMEOUT_S))
            else:
                dist.barrier()
        except RuntimeError as e:  # a peer is gone; the alert is already written by whoever could
            log.error("barrier after the SDC verdict failed: %s", e)
    on_verdict(alert, rank=rank)
    return alert
