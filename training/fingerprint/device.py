"""Device-side fingerprints ("dfp64-v1"): exact integer arithmetic in torch ops, so a tensor is fingerprinted
where it lives and only 8 bytes per tensor (or per replica, combined) cross to the host.

The value depends only on the tensor's dtype, shape and logical bytes: the same on CPU and GPU, for any
strides, and for any kernel order, since every step is integer arithmetic modulo 2^64 (int64 wraps on
overflow in torch on CPU and CUDA) and integer sums are associative. No floating point is involved.

Definition. The logical bytes (row-major, the element's native little-endian bytes) are read as signed
32-bit words w_i; a last partial word is zero-filled. Words are laid out in rows of `ROW_WORDS`::

    S_r   = sum_c  w_{r,c} * Mc[c]                     (mod 2^64; Mc[c] odd, distinct, < 2^31)
    body  = sum_r  fmix64(S_r) * Mr[r]                 (mod 2^64; Mr[r] odd, distinct)
    fp    = fmix64(body + header)                      header: dtype, shape, byte length

What it catches, by construction (not by chance): any change confined to one 4-byte word (every single-
bit flip, +0 vs -0, a NaN payload), any change to two words of one row or one column that is not
itself a pair of equal-and-opposite multiples of the multipliers (every pair of bit flips, every swap of
two different words). Changes across rows go through the nonlinear fmix64 and escape with a chance of
about 2^-64; several words of one row changed together in their high bits escape with about 2^-32.
Strong evidence, not proof, like any 64-bit fingerprint.

Which fingerprint is used where: xxh3-64 (training.fingerprint) on CPU, where it is faster; this one on
CUDA, where copying the weights to the host would cost far more than hashing them in place (see
docs/gpu.md). Checkpoint manifests always carry xxh3, which the validator recomputes on CPU.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

import torch

ALGORITHM = "dfp64-v1"
ROW_WORDS = 4096
"""Words per row: long enough that the per-row stage is a small fraction, short enough that the column
multipliers stay in cache."""

CHUNK_ROWS = 1 << 14
"""Rows per row-sum call: 256 MiB of words, so the eager int64 product needs at most 512 MiB extra."""

_MASK64 = (1 << 64) - 1
_M1 = 0xBF58476D1CE4E5B9  # splitmix64's finalizer constants
_M2 = 0x94D049BB133111EB
_COL = (0x5851F42D, 0x14057B7E)  # (A, B) of Mc[c] = 2*((c*A + B) mod 2^30) + 1
_ROW = (0x2545F491, 0x1B873593)  # (A, B) of Mr[r]
_MAX_ROWS = 1 << 30  # Mr is distinct for r < 2^30: 16 TiB per tensor

RowSums = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _signed(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic: mask off the copied sign bits)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def fmix64_t(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on an int64 tensor (a bijection of 64-bit values), wrapping."""
    x = x ^ _srl(x, 30)
    x = x * _signed(_M1)
    x = x ^ _srl(x, 27)
    x = x * _signed(_M2)
    return x ^ _srl(x, 31)


def fmix64(v: int) -> int:
    """The same finalizer on a Python int (the reference for tests and the host-side combine)."""
    v &= _MASK64
    v ^= v >> 30
    v = (v * _M1) & _MASK64
    v ^= v >> 27
    v = (v * _M2) & _MASK64
    return v ^ (v >> 31)


def _multipliers(n: int, ab: tuple[int, int], device: torch.device) -> torch.Tensor:
    a, b = ab
    idx = torch.arange(n, dtype=torch.int64, device=device)
    return ((idx * a + b) & ((1 << 30) - 1)) * 2 + 1


_col_cache: dict[torch.device, torch.Tensor] = {}


def column_multipliers(device: torch.device) -> torch.Tensor:
    m = _col_cache.get(device)
    if m is None:
        m = _col_cache[device] = _multipliers(ROW_WORDS, _COL, device)
    return m


def header(dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> int:
    """The host-side part: dtype, shape and byte length, so equal bytes of another type or shape differ."""
    text = f"{ALGORITHM}|{dtype}|{tuple(shape)}|{nbytes}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def _eager_row_sums(words: torch.Tensor, mc: torch.Tensor) -> torch.Tensor:
    """S_r for a [rows, ROW_WORDS] int32 matrix: one int32 -> int64 multiply, one integer row sum."""
    return (words * mc).sum(dim=1)


def _words(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(int32 words, zero-filled last word or None, byte length) of the tensor's logical contents."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    raw = t.reshape(-1).view(torch.uint8)  # 0-dim tensors too; bool and complex view as bytes
    n = raw.numel()
    n4 = n - n % 4
    main = raw[:n4]
    if (main.storage_offset() % 4) != 0:  # a view of an unaligned slice: align with one copy
        main = main.clone()
    words = main.view(torch.int32)
    tail = None
    if n % 4:
        shifts = torch.arange(n % 4, dtype=torch.int64, device=raw.device) * 8
        tail = (raw[n4:].to(torch.int64) << shifts).sum().reshape(1)
    return words, tail, n


def body(t: torch.Tensor, *, row_sums: RowSums | None = None) -> torch.Tensor:
    """The device part of the fingerprint: a 0-dim int64 tensor on `t`'s device (no host sync)."""
    words, tail, _ = _words(t)
    device = words.device
    mc = column_multipliers(device)
    full = words.numel() // ROW_WORDS
    rest = words[full * ROW_WORDS :]
    if tail is not None:
        rest = torch.cat([rest.to(torch.int64), tail])
    rows = full + (1 if rest.numel() else 0)
    if rows > _MAX_ROWS:
        raise ValueError(
            f"tensor of {words.numel() * 4} bytes: over the {_MAX_ROWS} rows dfp64 distinguishes"
        )
    parts = []
    rs = row_sums or _eager_row_sums
    for r0 in range(0, full, CHUNK_ROWS):  # bounded temporaries: the eager product is 2x its chunk
        r1 = min(full, r0 + CHUNK_ROWS)
        parts.append(rs(words[r0 * ROW_WORDS : r1 * ROW_WORDS].view(r1 - r0, ROW_WORDS), mc))
    if rest.numel():
        parts.append((rest * mc[: rest.numel()]).sum().reshape(1))
    if not parts:
        return torch.zeros((), dtype=torch.int64, device=device)
    s = parts[0] if len(parts) == 1 else torch.cat(parts)
    mr = _multipliers(rows, _ROW, device)
    return (fmix64_t(s) * mr).sum()


def fingerprint_tensor_device(t: torch.Tensor, *, row_sums: RowSums | None = None) -> torch.Tensor:
    """dfp64 of one tensor as a 0-dim int64 tensor on its device (signed view of the unsigned value)."""
    h = _signed(header(t.dtype, tuple(t.shape), t.numel() * t.element_size()))
    return fmix64_t(body(t, row_sums=row_sums) + h)


def fingerprint_tensor(t: torch.Tensor) -> int:
    """dfp64 of one tensor as an unsigned 64-bit int (one 8-byte copy to the host)."""
    return int(fingerprint_tensor_device(t).item()) & _MASK64


def _name_key(name: str) -> int:
    return _signed(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") | 1)


def fingerprint_state_device(
    state: Mapping[str, torch.Tensor], *, row_sums: RowSums | None = None
) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """(names, per-tensor int64 fingerprints [T], combined int64 fingerprint) without leaving the device.

    The combined value is order-independent in the mapping: sum over names of fmix64(fp_t ^ key(name)).
    """
    names = sorted(n for n, t in state.items() if isinstance(t, torch.Tensor))
    if not names:
        return [], torch.zeros(0, dtype=torch.int64), torch.zeros((), dtype=torch.int64)
    fps = torch.stack([fingerprint_tensor_device(state[n], row_sums=row_sums) for n in names])
    keys = torch.tensor([_name_key(n) for n in names], dtype=torch.int64, device=fps.device)
    return names, fps, fmix64_t(fps ^ keys).sum()


def fingerprint_state(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, str], str]:
    """Hex per-tensor fingerprints and the combined one (one copy of T+1 int64 values to the host)."""
    names, fps, combined = fingerprint_state_device(state)
    values = torch.cat([fps, combined.reshape(1)]).tolist() if names else [0]
    return {
        n: f"{v & _MASK64:016x}" for n, v in zip(names, values, strict=False)
    }, f"{values[-1] & _MASK64:016x}"


def compiled_row_sums() -> RowSums:
    """`_eager_row_sums` through torch.compile: one fused pass over the words on CUDA (the same integers,
    since integer sums do not depend on order). The eager version is the reference."""
    return torch.compile(_eager_row_sums, dynamic=True, fullgraph=True)  # type: ignore[return-value]


# ---- a pure-Python reference (tests pin the torch version to it) ----------------------------------------


def reference_fingerprint(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    """dfp64 from raw bytes with Python ints only: slow, obviously correct, for small inputs in tests."""
    n = len(data)
    padded = data + b"\0" * (-n % 4)
    words = [int.from_bytes(padded[i : i + 4], "little", signed=i + 4 <= n) for i in range(0, len(padded), 4)]
    total = 0
    for r in range(0, len(words), ROW_WORDS):
        s = 0
        for c, w in enumerate(words[r : r + ROW_WORDS]):
            s += w * (2 * ((c * _COL[0] + _COL[1]) & ((1 << 30) - 1)) + 1)
        row = r // ROW_WORDS
        total += fmix64(s) * (2 * ((row * _ROW[0] + _ROW[1]) & ((1 << 30) - 1)) + 1)
    return fmix64(total + header(dtype, shape, n))


def fingerprint_where_it_lives(t: torch.Tensor) -> int:
    """One tensor's 64-bit fingerprint by where it lives: xxh3-64 in host memory (faster there), dfp64 on
    an accelerator (8 bytes to the host instead of the tensor). Compare values only between tensors on
    the same kind of device."""
    if t.device.type == "cpu":
        from training.fingerprint.host import fingerprint_tensor as xxh3_fingerprint

        return xxh3_fingerprint(t)
    return fingerprint_tensor(t)
