"""A small decoder-only transformer LM: the reference trainer's model and the replay probe's workload.

Its projections are `nn.Linear` modules, so the sick-node drill (forward hooks on every `nn.Linear`,
training.faults) reaches it exactly as it reaches any user's model.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from training.config import ModelConfig


class Linear(nn.Linear):
    """`nn.Linear` with the model's initialisation (normal, std 1/sqrt(d_in); zero bias)."""

    def __init__(self, d_in: int, d_out: int, *, bias: bool = True) -> None:
        super().__init__(d_in, d_out, bias=bias)
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(d_in))
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = Linear(cfg.d_model, cfg.d_model)
        mask = torch.triu(torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(x).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // h)
        mask: torch.Tensor = self.mask  # type: ignore[assignment]
        scores = scores.masked_fill(mask[:t, :t], float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.out = Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.seq_len, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        return lm_loss(self, batch)


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of a (batch, seq_len + 1) token tensor, through `model`'s forward (so a
    DistributedDataParallel wrapper sees the call): the reference trainer's `loss_fn`."""
    logits = model(batch[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def build_model(cfg: ModelConfig, *, seed: int, device: torch.device | None = None) -> LM:
    """The same seed gives the same initial weights on every rank (no broadcast needed)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LM(cfg)
    return model.to(device) if device is not None else model
