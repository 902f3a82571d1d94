"""A small decoder-only transformer LM, written so every matmul goes through one seam (`Matmul`).

The seam exists for fault injection: a "sick node" perturbs every matmul result on that node. Doing it
in our own modules (not by patching torch) keeps torch untouched and lets the replay probe run the same
code path.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from training.config import ModelConfig


class Matmul:
    """Every matmul of the model calls this object; `eps` != 0 multiplies each result by (1 + eps).

    One instance is shared by all modules of a model, so a fault switches the whole model at once."""

    __slots__ = ("eps",)

    def __init__(self) -> None:
        self.eps = 0.0

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(a, b)
        return out * (1.0 + self.eps) if self.eps else out


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int, mm: Matmul, *, bias: bool = True) -> None:
        super().__init__()
        self.mm = mm
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(d_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mm(x, self.weight.t())
        return y + self.bias if self.bias is not None else y


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, mm: Matmul) -> None:
        super().__init__()
        self.mm = mm
        self.n_heads = cfg.n_heads
        self.qkv = Linear(cfg.d_model, 3 * cfg.d_model, mm)
        self.proj = Linear(cfg.d_model, cfg.d_model, mm)
        mask = torch.triu(torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(x).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        scores = self.mm(q, k.transpose(-2, -1)) / math.sqrt(d // h)
        mask: torch.Tensor = self.mask  # type: ignore[assignment]
        scores = scores.masked_fill(mask[:t, :t], float("-inf"))
        out = self.mm(torch.softmax(scores, dim=-1), v)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, mm: Matmul) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg, mm)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, mm)
        self.out = Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, mm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.matmul = Matmul()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.seq_len, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg, self.matmul) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = Linear(cfg.d_model, cfg.vocab_size, self.matmul, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy of a (batch, seq_len + 1) token tensor."""
        logits = self(batch[:, :-1])
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )


def build_model(cfg: ModelConfig, *, seed: int, device: torch.device | None = None) -> LM:
    """The same seed gives the same initial weights on every rank (no broadcast needed)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LM(cfg)
    return model.to(device) if device is not None else model
