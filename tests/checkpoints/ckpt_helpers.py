"""Helpers shared by the checkpoint tests (imported by name: this directory is on sys.path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def tiny_state(seed: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A small model's and Adam's state dicts after one step (deterministic per seed)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    return model.state_dict(), opt.state_dict()


Saver = Callable[..., dict[int, dict[str, torch.Tensor]]]
