"""Synthetic, seeded token data: the micro-batch of (seed, step, rank) is a pure function of those three.

`SyntheticBatches` is the reference trainer's data loader: its state is the next step, saved and restored
by the guard like any user's loader, so a resumed run sees exactly the data an uninterrupted one would have
seen.
"""

from __future__ import annotations

import torch
import xxhash

from training.config import ModelConfig


def batch_seed(seed: int, step: int, rank: int) -> int:
    """A 63-bit generator seed, well mixed so neighbouring (step, rank) pairs are unrelated."""
    return xxhash.xxh3_64_intdigest(f"longrun-data:{seed}:{step}:{rank}".encode()) >> 1


def micro_batch(cfg: ModelConfig, *, seed: int, step: int, rank: int) -> torch.Tensor:
    """A (batch_size, seq_len + 1) int64 tensor of tokens.

    Each sequence is an arithmetic progression modulo the vocabulary (learnable: the loss falls) with 10%
    of its tokens replaced by noise."""
    g = torch.Generator().manual_seed(batch_seed(seed, step, rank))
    n, t, v = cfg.batch_size, cfg.seq_len + 1, cfg.vocab_size
    start = torch.randint(0, v, (n, 1), generator=g)
    stride = torch.randint(1, 8, (n, 1), generator=g)
    tokens = (start + stride * torch.arange(t)) % v
    noise = torch.randint(0, v, (n, t), generator=g)
    keep = torch.rand((n, t), generator=g) >= 0.1
    return torch.where(keep, tokens, noise)


class SyntheticBatches:
    """This rank's micro-batches, one per step, as an iterator with a state (`state_dict` /
    `load_state_dict`): the next step it yields. The guard saves that state and gives it back on resume,
    as it does for any user's data loader."""

    def __init__(self, cfg: ModelConfig, *, seed: int, rank: int, device: torch.device | None = None) -> None:
        self.cfg, self.seed, self.rank, self.device = cfg, seed, rank, device
        self.next_step = 1

    def __iter__(self) -> SyntheticBatches:
        return self

    def __next__(self) -> torch.Tensor:
        batch = micro_batch(self.cfg, seed=self.seed, step=self.next_step, rank=self.rank)
        self.next_step += 1
        return batch.to(self.device) if self.device is not None else batch

    def state_dict(self) -> dict[str, int]:
        return {"next_step": self.next_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_step = int(state["next_step"])
