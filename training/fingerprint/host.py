"""Exact fingerprints of tensors: xxh3-64 over their raw bytes.

A fingerprint equal across replicas is strong evidence that the bytes are equal (a 64-bit hash collision
is ~2^-64 per comparison); it is not proof. A float sum is not used: it cancels, misses swaps and +-0, and
depends on reduction order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import xxhash

_MASK = (1 << 64) - 1


def fingerprint_tensor(t: torch.Tensor) -> int:
    """xxh3-64 of the tensor's bytes (dtype and shape included), as an unsigned 64-bit int."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    h = xxhash.xxh3_64()
    h.update(f"{t.dtype}:{tuple(t.shape)}".encode())
    if t.numel():
        flat = t.reshape(-1)  # a 0-dim tensor cannot be viewed as bytes
        h.update(flat.view(torch.uint8).numpy().data if t.dtype != torch.bool else flat.numpy().tobytes())
    return h.intdigest()


def to_int64(fp: int) -> int:
    """An unsigned 64-bit fingerprint as a signed int64, so it fits a torch.int64 tensor for all_gather."""
    fp &= _MASK
    return fp - (1 << 64) if fp >= 1 << 63 else fp


def from_int64(v: int) -> int:
    return v & _MASK


def hex64(fp: int) -> str:
    return f"{fp & _MASK:016x}"


def local_part(t: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a state tensor: a sharded `DTensor`'s local shard, else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def local_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict with every tensor replaced by this rank's local part of it."""
    return {name: local_part(t) for name, t in state.items() if isinstance(t, torch.Tensor)}


def fingerprint_state(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Hex fingerprint of each tensor in a state dict, keyed by name."""
    return {name: hex64(fingerprint_tensor(t)) for name, t in state.items() if isinstance(t, torch.Tensor)}


def combine(fingerprints: Mapping[str, str]) -> str:
    """One fingerprint over a name -> hex mapping (order-independent in the input, fixed in the hash)."""
    h = xxhash.xxh3_64()
    for name in sorted(fingerprints):
        h.update(f"{name}={fingerprints[name]};".encode())
    return h.hexdigest()


def fingerprint_sequence(values: Sequence[int]) -> int:
    """One 64-bit value over an ordered sequence of 64-bit fingerprints (order matters)."""
    h = xxhash.xxh3_64()
    for v in values:
        h.update((v & _MASK).to_bytes(8, "little"))
    return h.intdigest()
