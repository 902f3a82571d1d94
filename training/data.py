"""Synthetic, seeded token data: the micro-batch of (seed, step, rank) is a pure function of those three.

No iterator state: any rank can produce any rank's micro-batch for any step (the recompute check needs
that), and a resumed run sees exactly the data an uninterrupted one would have seen.
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
