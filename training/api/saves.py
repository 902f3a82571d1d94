"""How a guarded run saves checkpoints: rank 0's background saver and what each save's manifest says.

Every rank takes part in a save (its per-rank state is gathered to rank 0: training.api.state); rank 0
snapshots the weights, the optimizer, the scheduler and the gathered state, and its saver writes and
uploads them off the training step (training.checkpoint.saver).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from training.api.records import code_version
from training.checks.base import CheckResult
from training.events import EventWriter
from training.fingerprint.host import combine, fingerprint_state
from training.store.interface import ObjectStore

if TYPE_CHECKING:
    from training.checkpoint.sharded import PendingShardedSave

log = logging.getLogger(__name__)


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
        fields = self.manifest_fields(step=step, loss=loss, results=results, passed=passed, fingerprints=fps)
        self.saver.save(
            step=step,
            model_state=model.state_dict(),
            optim_state=optimizer.state_dict(),
            extra={"step": step, "last_pass": passed, "seed": self.seed, **extra},
            manifest_fields=fields,
        )
        events.flush()

    def manifest_fields(
        self,
        *,
        step: int,
        loss: float,
        results: list[CheckResult],
        passed: Mapping[str, int],
        fingerprints: Mapping[str, str] | None,
    ) -> dict[str, Any]:
        """What the manifest of the save at `step` says besides its files: the whole model's tensor
        fingerprints (None: the saver hashes its snapshot; `{}`: a sharded save, whose record carries every
        rank's shard fingerprints instead), the weight vote of this step, the checks' coverage (`passed`:
        each check's last passing step, this step's included), the loss, the world and the code version."""
        vote = next((r for r in results if r.check == "weight_vote"), None)
        fps = fingerprints
        return {
            **({"fingerprints": dict(fps)} if fps is not None else {}),
            **({"fingerprint": combine(fps)} if fps else {}),
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

    def close(self) -> None:
        if self.saver is not None:
            self.saver.wait()
            self.saver.close()


class ShardedUploads:
    """Rank 0's end of each sharded save, one at a time, off the training step: wait until every rank's
    files are written (an async save: `PendingShardedSave.finish`, which writes the manifest), then upload
    the folder to the store (training.checkpoint.sharded_store). Once written the folder is whole and never
    written again, so the step waits for neither. `close()` waits for all of it; an upload is bounded by the
    uploader's own retry deadline, and nothing here raises: a save that failed to write logs why and has no
    manifest, so it is never uploaded or taken for whole."""

    def __init__(self, *, run: str, store: ObjectStore | None) -> None:
        self.run, self.store = run, store
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[dict[str, Any]]] = []

    @property
    def active(self) -> bool:
        """Some upload was started (close() has something to wait for)."""
        return bool(self._pending)

    def submit(
        self,
        *,
        step: int,
        folder: Path,
        manifest_fields: Mapping[str, Any],
        pending: PendingShardedSave | None = None,
    ) -> None:
        """Finish (`pending`: an async save) and upload the sharded checkpoint of `step` in `folder` (no
        upload without a store)."""
        if self.store is None and pending is None:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longrun-sharded-upload")
        self._pending.append(
            self._pool.submit(self._finish_and_upload, step, folder, dict(manifest_fields), pending)
        )

    def _finish_and_upload(
        self, step: int, folder: Path, manifest_fields: dict[str, Any], pending: PendingShardedSave | None
    ) -> dict[str, Any]:
        from training.checkpoint.sharded_store import upload_sharded

        if pending is not None:
            try:
                pending.finish()
            except Exception as e:  # noqa: BLE001 - DCP's failure, whatever its type: this save has no manifest
                return {"ok": False, "step": step, "error": f"the sharded save did not complete: {e!r}"}
        if self.store is None:
            return {"ok": True, "step": step}
        return upload_sharded(
            self.store, run=self.run, step=step, folder=folder, manifest_fields=manifest_fields
        )

    def close(self) -> None:
        """Wait for every upload and log the ones that did not publish their checkpoint."""
        for future in self._pending:
            record = future.result()
            if not record.get("ok"):
                log.error(
                    "sharded checkpoint of step %s not published: %s", record.get("step"), record.get("error")
                )
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
