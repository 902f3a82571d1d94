"""How a guarded run saves checkpoints: rank 0's background saver and what each save's manifest says.

Every rank takes part in a save (its per-rank state is gathered to rank 0: training.api.state); rank 0
snapshots the weights, the optimizer, the scheduler and the gathered state, and its saver writes and
uploads them off the training step (training.checkpoint.saver).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.api.records import code_version
from training.checks.base import CheckResult
from training.events import EventWriter
from training.fingerprint.host import combine, fingerprint_state
from training.store.interface import ObjectStore


class Saves:
    """Rank 0's saver (None elsewhere, or when checkpoints are off) and the manifest of each save."""

    def __init__(
        self, *, run: str, run_dir: Path, store: ObjectStore | None, world: int, nodes: list[str], seed: int,
        enabled: bool,
    ) -> None:  # fmt: skip
        self.world, self.nodes, self.seed = world, nodes, seed
        self.saver: Any = None
        if enabled:
            from training.checkpoint.saver import CheckpointSaver

            self.saver = CheckpointSaver(run=run, run_dir=run_dir, store=store)

    def save(
        self,
        *,
        step: int,
        loss: float,
        results: list[CheckResult],
        last_pass: Mapping[str, int],
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: Mapping[str, Any],
        events: EventWriter,
    ) -> None:
        if self.saver is None:
            return
        vote = next((r for r in results if r.check == "weight_vote"), None)
        # This step's passes count: the save happens after them.
        passed = {**last_pass, **{r.check: step for r in results if r.verdict == "pass"}}
        # A vote on CUDA carries dfp64 values, not the manifest's xxh3: the saver then hashes its snapshot.
        fps = vote.extra.get("fingerprints") if vote else fingerprint_state(model.state_dict())
        fields = {
            **({"fingerprints": fps, "fingerprint": combine(fps)} if fps is not None else {}),
            "weight_vote": (
                {
                    "step": step,
                    "verdict": vote.verdict,
                    "ranks": self.world,
                    "votes": vote.extra["votes"],
                    "algorithm": vote.extra.get("algorithm", "xxh3-64"),
                }  # fmt: skip
                if vote
                else {"step": step, "verdict": "skip", "ranks": self.world}
            ),
            "coverage": {c: s for c, s in passed.items() if s <= step},
            "loss": loss,
            "world": {"nodes": sorted(set(self.nodes)), "ranks": self.nodes, "world_size": self.world},
            "code_version": code_version(),
        }
        self.saver.save(
            step=step,
            model_state=model.state_dict(),
            optim_state=optimizer.state_dict(),
            extra={"step": step, "last_pass": passed, "seed": self.seed, **extra},
            manifest_fields=fields,
        )
        events.flush()

    def close(self) -> None:
        if self.saver is not None:
            self.saver.wait()
            self.saver.close()
