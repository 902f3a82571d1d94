"""The recompute check on sharded models: real FSDP2 (`fully_shard`) on six real gloo ranks (CPU; nothing
mocked), through `Guard.prepare_sharded` and `Guard.run`, with a dropout layer (the recompute must draw the
owner's masks: the owner's RNG fork).

At an audit step every rank recomputes, forward and backward and all at once, rank (r + k)'s micro-batch, k
the smallest offset onto another node (on 3 nodes of 2 ranks: the same column of the next HSDP row), and
compares the loss and the local gradient (seen where FSDP reduce-scatters it). In one spawn of six processes,
one guarded run after another on the same process group:
- HSDP 3 x 2 (nodes n1 n1 n2 n2 n3 n3), recompute every 2 steps, clean: every audit passes, exit 0, and
  every rank's final shards and its torch RNG state equal those of the same run without the recompute (the
  check changes nothing: no gradient touched, FSDP's gathered parameters put back, the RNG restored); the
  same with FSDP2 groups per layer (`fully_shard` on each Linear, then the root);
- HSDP 3 x 2, `sick-node` on n3 from step 3: the recompute fails at step 4 and names ranks 4 and 5 (node n3)
  by majority, the update is skipped, exit 93 (the finite check and the weight vote see nothing there);
- HSDP 3 x 2 and FSDP2, a fault only in backward on n3 from step 3 (a layer that is the identity forward and
  scales its gradient by 1 + 1e-3 backward, on n3's ranks only: a kernel wrong only in the gradient): the
  loss is right everywhere, so only the gradient comparison can see it; the recompute fails at step 4 and
  names ranks 4 and 5, and the votes show equal losses and different gradient fingerprints;
- HSDP 2 x 3 (nodes n1 n1 n1 n2 n2 n2), `sick-node` on n2: the mismatch is seen, nobody is named
  (`why_unnamed`: 2 nodes);
- FSDP2 over all six ranks (no replica), recompute every 2: clean passes with the shards of the run without
  it; `sick-node` on n3 is named (ranks 4 and 5).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from helpers.gloo_ranks import join_group, spawn_ranks, write_result
from torch import nn

WORLD = 6
THREE_NODES = "n1,n1,n2,n2,n3,n3"
TWO_NODES = "n1,n1,n1,n2,n2,n2"


class _WrongGradient(torch.autograd.Function):
    """The identity forward; backward, the gradient times (1 + 1e-3)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * (1 + 1e-3)


class _BackwardFault(nn.Module):
    """A layer that is wrong only in backward while `on` (the test turns it on for the sick node's ranks)."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _WrongGradient.apply(x) if self.on else x


def _model(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 12), nn.ReLU(), _BackwardFault(), nn.Dropout(0.25), nn.Linear(12, 6))


def _batches(rank: int) -> Any:
    i = 0
    while True:
        yield torch.randn(4, 8, generator=torch.Generator().manual_seed(1000 * i + rank))
        i += 1


def _loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


def _guarded(
    out: str, name: str, mesh: Any, *, nodes: str, recompute_every: int, checks: tuple[str, ...],
    faults: tuple[Any, ...] = (), per_layer: bool = False, backward_sick: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One guarded run of six steps: its exit code, this rank's final local shards and RNG state, its
    recompute results, and its alert (if any)."""
    from training.api import CheckConfig, Guard, GuardConfig
    from training.fingerprint.host import fingerprint_state, local_state

    os.environ["LONGRUN_NODE_NAMES"] = nodes
    os.environ["LONGRUN_FAULT_STATE_DIR"] = str(Path(out, name, "fault-state"))  # the sick-node marker
    run_dir = Path(out, name)
    cfg = GuardConfig(
        run=name, run_dir=run_dir, steps=6, checkpoint_every=0, use_store=False,
        checks=CheckConfig(checks=checks, recompute_every=recompute_every, vote_every=3),
    )  # fmt: skip
    guard = Guard(cfg, faults=faults)
    model = _model(0)
    if per_layer:  # FSDP2 groups per layer, the root last (prepare_sharded shards the root)
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
    model = guard.prepare_sharded(
        model, mesh=mesh, loss_fn=_loss,
        make_optimizer=lambda params: torch.optim.AdamW(params, lr=0.05),
    )  # fmt: skip
    audits: list[dict[str, Any]] = []
    data = _batches(guard.rank)
    (fault_layer,) = [m for m in model.modules() if isinstance(m, _BackwardFault)]
    with guard:
        while not guard.done:
            fault_layer.on = backward_sick and guard.place.node == "n3" and guard.next_step >= 3
            outcome = guard.step(next(data))
            audits += [
                {"step": r.step, "verdict": r.verdict, "evidence": r.evidence}
                for r in outcome.results
                if r.check == "recompute"
            ]
    alerts = [json.loads(p.read_text()) for p in sorted((run_dir / "alerts").glob("*.json"))]
    return {
        "code": guard.exit_code,
        "shards": fingerprint_state(local_state(model.state_dict())),
        "rng": hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest(),
        "audits": audits,
        "alerts": [
            {
                "check": a["check"],
                "step": a["step"],
                "suspects": a["suspect_ranks"],
                "evidence": a["evidence"],
            }
            for a in alerts
        ],
    }


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from training.faults import Fault

    join_group(rank, world, port)
    found: dict[str, Any] = {}
    every, no_recompute = ("finite", "recompute", "weight_vote"), ("finite", "weight_vote")
    sick3 = (Fault(kind="sick-node", step=3, node="n3"),)
    try:
        hsdp = init_device_mesh("cpu", (3, 2), mesh_dim_names=("replicate", "shard"))
        two_rows = init_device_mesh("cpu", (2, 3), mesh_dim_names=("replicate", "shard"))
        fsdp = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
        runs = [  # name, mesh, nodes, recompute_every, checks, faults
            ("plain", hsdp, THREE_NODES, 0, no_recompute, ()),
            ("clean", hsdp, THREE_NODES, 2, every, ()),
            ("layers_plain", hsdp, THREE_NODES, 0, no_recompute, ()),
            ("layers_clean", hsdp, THREE_NODES, 2, every, ()),
            ("sick", hsdp, THREE_NODES, 2, every, sick3),
            ("two_rows", two_rows, TWO_NODES, 2, every, (Fault(kind="sick-node", step=3, node="n2"),)),
            ("fsdp_plain", fsdp, THREE_NODES, 0, ("finite",), ()),
            ("fsdp_clean", fsdp, THREE_NODES, 2, ("finite", "recompute"), ()),
            ("fsdp_sick", fsdp, THREE_NODES, 2, ("finite", "recompute"), sick3),
            ("backward_sick", hsdp, THREE_NODES, 2, every, ()),
            ("fsdp_backward_sick", fsdp, THREE_NODES, 2, ("finite", "recompute"), ()),
        ]
        for name, mesh, nodes, cadence, checks, faults in runs:
            found[name] = _guarded(
                out, name, mesh, nodes=nodes, recompute_every=cadence, checks=checks, faults=faults,
                per_layer=name.startswith("layers"), backward_sick="backward_sick" in name,
            )  # fmt: skip
        write_result(out, rank, found)
    finally:
        dist.destroy_process_group()


def test_recompute_on_sharded_models_passes_clean_changes_nothing_and_names_a_sick_node(
    tmp_path: Path,
) -> None:
    per_rank = spawn_ranks(_worker, WORLD, tmp_path)
    for rank, found in enumerate(per_rank):
        for plain, clean in (
            ("plain", "clean"),
            ("layers_plain", "layers_clean"),
            ("fsdp_plain", "fsdp_clean"),
        ):
            assert (found[plain]["code"], found[plain]["alerts"]) == (0, []), (rank, found[plain])
            assert (found[clean]["code"], found[clean]["alerts"]) == (0, []), (rank, found[clean])
            audits = [(a["step"], a["verdict"]) for a in found[clean]["audits"]]
            assert audits == [(2, "pass"), (4, "pass"), (6, "pass")], (rank, clean)
            assert found[clean]["shards"] == found[plain]["shards"], (rank, clean)  # bit for bit
            assert found[clean]["rng"] == found[plain]["rng"], (rank, clean)
        (audit, *_) = found["clean"]["audits"]
        assert audit["evidence"]["offset"] == 2 and audit["evidence"]["cross_node"] is True
        assert audit["evidence"]["compared"].startswith("loss and local gradient")
        for sick in ("sick", "fsdp_sick", "backward_sick", "fsdp_backward_sick"):
            assert found[sick]["code"] == 93, (rank, found[sick])
            assert [(a["step"], a["verdict"]) for a in found[sick]["audits"]] == [(2, "pass"), (4, "fail")]
        assert found["two_rows"]["code"] == 93, (rank, found["two_rows"])

    for sick in ("sick", "fsdp_sick", "backward_sick", "fsdp_backward_sick"):
        (alert,) = per_rank[0][sick]["alerts"]
        assert (alert["check"], alert["step"], alert["suspects"]) == ("recompute", 4, [4, 5]), alert
        evidence = alert["evidence"]
        assert evidence["attributable"] is True
        # Ranks 4, 5 (n3) report wrong losses, and recompute ranks 0, 1's batches wrong: 4 disputed batches.
        assert sorted(p["target"] for p in evidence["pairs"]) == [0, 1, 4, 5]
        for target in ("0", "4"):
            opinions = evidence["votes"][target]
            assert opinions["4"] == opinions["5"] != opinions["0"] == opinions["1"] == opinions["2"]
        assert set(evidence["pairs"][0]["reported"]) == {"loss", "grad_fingerprint"}
        if "backward" in sick:  # the losses agree: only the gradient tells the sick node apart
            opinions = evidence["votes"]["0"]
            assert len({o["loss"] for o in opinions.values()}) == 1, opinions
            assert len({o["grad_fingerprint"] for o in opinions.values()}) == 2, opinions
    (alert,) = per_rank[0]["two_rows"]["alerts"]
    assert (alert["check"], alert["step"], alert["suspects"]) == ("recompute", 4, []), alert
    assert alert["evidence"]["attributable"] is False
    assert "2 node(s)" in alert["evidence"]["why_unnamed"]
    assert alert["evidence"]["offset"] == 3
    assert sorted(p["target"] for p in alert["evidence"]["pairs"]) == [0, 1, 2, 3, 4, 5]
