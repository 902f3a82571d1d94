"""A small MLP classifier guarded by longrun (docs/adopting.md), written from the document alone.

Data: four interleaved noisy spirals in 2-D, lifted to 16 features by a fixed random projection plus
noise, generated deterministically from the run's seed. Each rank reads its own shard; the shards are
reshuffled every epoch with a generator seeded from (seed, epoch).

Launch under torchrun (or longrun's `training_run`, entrypoint `script:examples/adopted/classifier.py`);
settings come from the LONGRUN_* environment (LONGRUN_RUN_DIR, LONGRUN_STEPS, ...).
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

from training.api.guard import Guard
from training.config import GuardConfig

N_CLASSES = 4
N_FEATURES = 16
N_SAMPLES = 1536
BATCH = 64  # per rank


def make_dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy interleaved spirals, lifted to N_FEATURES dims; the same on every rank for a given seed."""
    g = torch.Generator().manual_seed(seed)
    per_class = N_SAMPLES // N_CLASSES
    xs, ys = [], []
    for c in range(N_CLASSES):
        r = torch.rand(per_class, generator=g) * 1.0 + 0.05
        theta = r * 1.5 * math.pi + c * (2.0 * math.pi / N_CLASSES)
        theta = theta + 0.25 * torch.randn(per_class, generator=g)
        pts = torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=1)
        xs.append(pts)
        ys.append(torch.full((per_class,), c, dtype=torch.long))
    x2 = torch.cat(xs)
    y = torch.cat(ys)
    proj = torch.randn(2, N_FEATURES, generator=g)
    x = torch.tanh(x2 @ proj) + 0.05 * torch.randn(x2.shape[0], N_FEATURES, generator=g)
    return x, y


class ShardedLoader:
    """Infinite iterator over this rank's shard; reshuffles each epoch; resumable via state_dict."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, rank: int, world: int, batch: int, seed: int):
        self.x, self.y = x, y
        self.rank, self.world, self.batch, self.seed = rank, world, batch, seed
        self.per_rank = x.shape[0] // world
        self.batches_per_epoch = self.per_rank // batch  # drop the last partial batch
        self.epoch = 0
        self.pos = 0  # batches already yielded in this epoch
        self._order: torch.Tensor | None = None
        self._order_epoch = -1

    def _shard(self) -> torch.Tensor:
        if self._order_epoch != self.epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            perm = torch.randperm(self.x.shape[0], generator=g)
            self._order = perm[: self.per_rank * self.world][self.rank :: self.world]
            self._order_epoch = self.epoch
        assert self._order is not None
        return self._order

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self.pos >= self.batches_per_epoch:
            self.epoch += 1
            self.pos = 0
        idx = self._shard()[self.pos * self.batch : (self.pos + 1) * self.batch]
        self.pos += 1
        return {"x": self.x[idx].clone(), "y": self.y[idx].clone()}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "rank": self.rank, "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        if state["world"] != self.world or state["rank"] != self.rank:
            raise ValueError(
                f"loader state is for rank {state['rank']}/{state['world']}, not {self.rank}/{self.world}"
            )
        self.epoch = int(state["epoch"])
        self.pos = int(state["pos"])
        self._order_epoch = -1


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(N_FEATURES, 64),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(64, 64),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(64, N_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def loss_fn(model, batch):
    # model: the DDP wrapper, or the plain module in a recompute. Pure: same weights, batch, RNG -> same loss.
    return F.cross_entropy(model(batch["x"]), batch["y"])


def main() -> int:
    config = GuardConfig.from_env(grad_clip=1.0)
    guard = Guard(config)  # starts the process group itself
    seed = config.seed

    torch.manual_seed(seed)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=8, gamma=0.5)
    x, y = make_dataset(seed)
    loader = ShardedLoader(x, y, rank=guard.rank, world=guard.world, batch=BATCH, seed=seed)

    guard.prepare(model, optimizer, loss_fn=loss_fn, scheduler=scheduler, state={"data": loader})
    code = guard.run(loader)  # 0 when done, 93 after an SDC verdict

    if code == 0 and guard.rank == 0:
        model.eval()
        with torch.no_grad():
            acc = (model(x).argmax(dim=1) == y).float().mean().item()
        print(
            f"[classifier] done: train accuracy {acc:.3f} (epoch {loader.epoch}, batch {loader.pos})",
            flush=True,
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
