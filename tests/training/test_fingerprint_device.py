"""The device-side fingerprint (dfp64) pinned on CPU: golden values, a pure-Python reference, every dtype the
model uses, non-contiguous views, odd byte lengths, single-bit flips, swaps, +0/-0 and NaN payloads.

The same torch ops run on CUDA; bench/gpu/run.sh checks GPU == CPU on a device (none runs here).
"""

from __future__ import annotations

import random
import struct

import pytest
import torch

from training.fingerprint import device as fd

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool]  # fmt: skip


def raw_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes()


def sample(dtype: torch.dtype, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 50).to(dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**62)), min(info.max, 2**62), (n,), generator=g, dtype=dtype)


# Golden values: a change to the definition must change these on purpose (and bump ALGORITHM).
GOLDEN = {
    "arange_f32_10": "9dec09e752984f89",
    "empty_f32": "af2c6f0d88ab6641",
    "scalar_i64": "c85dce526ea1deab",
    "ones_bf16_3x3": "c1a7f66e05a8fc82",
}


def golden_inputs() -> dict[str, torch.Tensor]:
    return {
        "arange_f32_10": torch.arange(10, dtype=torch.float32),
        "empty_f32": torch.zeros(0, dtype=torch.float32),
        "scalar_i64": torch.tensor(-7, dtype=torch.int64),
        "ones_bf16_3x3": torch.ones(3, 3, dtype=torch.bfloat16),
    }


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_values(name: str) -> None:
    assert f"{fd.fingerprint_tensor(golden_inputs()[name]):016x}" == GOLDEN[name]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "n", [0, 1, 2, 3, 5, 7, fd.ROW_WORDS - 1, fd.ROW_WORDS, fd.ROW_WORDS + 3, 3 * fd.ROW_WORDS + 17]
)
def test_matches_python_reference(dtype: torch.dtype, n: int) -> None:
    t = sample(dtype, n, seed=n)
    assert fd.fingerprint_tensor(t) == fd.reference_fingerprint(raw_bytes(t), t.dtype, tuple(t.shape))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_views_fingerprint_their_logical_contents(dtype: torch.dtype) -> None:
    base = sample(dtype, 6 * 7 * 5, seed=1).reshape(6, 7, 5)
    views = [
        base.transpose(0, 2),
        base[:, 1:6:2],
        base[1:, :, 3],
        base.permute(1, 2, 0)[2:],
        base[:, ::3, ::2],
    ]
    views.append(base.reshape(-1)[3:])  # contiguous but at an odd storage offset (unaligned words)
    for v in views:
        assert fd.fingerprint_tensor(v) == fd.fingerprint_tensor(v.contiguous().clone())
        assert fd.fingerprint_tensor(v) == fd.reference_fingerprint(raw_bytes(v), v.dtype, tuple(v.shape))


def test_dtype_and_shape_are_part_of_the_value() -> None:
    x = torch.arange(8, dtype=torch.int32)
    values = {
        fd.fingerprint_tensor(x),
        fd.fingerprint_tensor(x.reshape(2, 4)),
        fd.fingerprint_tensor(x.view(torch.float32)),
        fd.fingerprint_tensor(x.view(torch.int64)),
        fd.fingerprint_tensor(x.view(torch.uint8)),
    }
    assert len(values) == 5


def flip(t: torch.Tensor, bit: int) -> torch.Tensor:
    """A copy of `t` with one bit of its logical bytes flipped."""
    b = bytearray(raw_bytes(t))
    b[bit // 8] ^= 1 << (bit % 8)
    out = torch.frombuffer(b, dtype=torch.uint8).clone()
    return out.view(t.dtype).reshape(t.shape) if t.dtype is not torch.bool else out.reshape(t.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64], ids=str)
def test_every_sampled_single_bit_flip_changes_the_value(dtype: torch.dtype) -> None:
    t = sample(dtype, 3 * fd.ROW_WORDS + 11, seed=2)
    base = fd.fingerprint_tensor(t)
    rng = random.Random(3)
    nbits = t.numel() * t.element_size() * 8
    bits = rng.sample(range(nbits), 300) + [0, nbits - 1, nbits - 8, 31, 32, 63]
    missed = [b for b in bits if fd.fingerprint_tensor(flip(t, b)) == base]
    assert missed == []


def test_pairs_of_flips_and_swaps_change_the_value() -> None:
    t = sample(torch.float32, 2 * fd.ROW_WORDS + 5, seed=4)
    base = fd.fingerprint_tensor(t)
    rng = random.Random(5)
    nbits = t.numel() * 32
    for _ in range(150):
        a, b = rng.sample(range(nbits), 2)
        assert fd.fingerprint_tensor(flip(flip(t, a), b)) != base
    # The same bit (the sign) in two words of one row, of one column, and of neither.
    for i, j in [(0, 1), (5, 5 + fd.ROW_WORDS), (3, 7 + fd.ROW_WORDS)]:
        s = t.clone()
        s[i], s[j] = -s[i], -s[j]
        assert fd.fingerprint_tensor(s) != base
    for _ in range(100):
        i, j = rng.sample(range(t.numel()), 2)
        s = t.clone()
        s[i], s[j] = t[j], t[i]
        assert fd.fingerprint_tensor(s) != base


def test_signed_zero_and_nan_payloads_differ() -> None:
    z = torch.zeros(9)
    nz = z.clone()
    nz[4] = -0.0
    assert fd.fingerprint_tensor(z) != fd.fingerprint_tensor(nz)
    nan1 = torch.tensor([struct.unpack("<f", struct.pack("<I", 0x7FC00000))[0]] * 3)
    nan2 = torch.frombuffer(
        bytearray(struct.pack("<3I", 0x7FC00000, 0x7FC00001, 0x7FC00000)), dtype=torch.float32
    )
    assert torch.isnan(nan2).all()
    assert fd.fingerprint_tensor(nan1) != fd.fingerprint_tensor(nan2)


def test_state_fingerprint_is_order_independent_and_names_count() -> None:
    a = {"w": torch.randn(5, 3), "b": torch.arange(4, dtype=torch.int64)}
    b = {"b": a["b"].clone(), "w": a["w"].clone()}
    fa, ca = fd.fingerprint_state(a)
    fb, cb = fd.fingerprint_state(b)
    assert (fa, ca) == (fb, cb)
    assert fa["w"] == f"{fd.fingerprint_tensor(a['w']):016x}"
    renamed = {"w2": a["w"], "b": a["b"]}
    assert fd.fingerprint_state(renamed)[1] != ca
    changed = {"w": a["w"].clone(), "b": a["b"]}
    changed["w"][2, 1] = torch.nextafter(changed["w"][2, 1], torch.tensor(1e9))
    assert fd.fingerprint_state(changed)[1] != ca


def test_device_part_stays_on_the_device_as_int64() -> None:
    names, fps, combined = fd.fingerprint_state_device({"x": torch.randn(10), "y": torch.randn(2, 2)})
    assert names == ["x", "y"] and fps.dtype is torch.int64 and fps.shape == (2,)
    assert combined.dtype is torch.int64 and combined.dim() == 0


def test_fmix_tensor_matches_python() -> None:
    vals = [0, 1, -1, 2**63 - 1, -(2**63), 123456789, -987654321987]
    got = fd.fmix64_t(torch.tensor(vals, dtype=torch.int64)).tolist()
    assert [g & (2**64 - 1) for g in got] == [fd.fmix64(v) for v in vals]


def test_a_custom_row_sum_kernel_must_give_the_same_integers() -> None:
    """The fast path (torch.compile on CUDA) plugs in through `row_sums`; any such kernel is pinned to the
    eager one. Here: a chunked version standing in for a differently ordered reduction."""

    def chunked(words: torch.Tensor, mc: torch.Tensor) -> torch.Tensor:
        halves = words.to(torch.int64).split(fd.ROW_WORDS // 2, dim=1)
        return sum((h * m).flip(1).sum(1) for h, m in zip(halves, mc.split(fd.ROW_WORDS // 2), strict=True))  # type: ignore[return-value]

    t = sample(torch.float32, 5 * fd.ROW_WORDS + 9, seed=6)
    assert fd.fingerprint_tensor_device(t, row_sums=chunked).item() == fd.fingerprint_tensor_device(t).item()


def test_where_it_lives_is_xxh3_on_cpu() -> None:
    from training.fingerprint.host import fingerprint_tensor as xxh3

    t = torch.randn(100)
    assert fd.fingerprint_where_it_lives(t) == xxh3(t)


def test_chunking_does_not_change_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    t = sample(torch.float32, 7 * fd.ROW_WORDS + 3, seed=8)
    whole = fd.fingerprint_tensor(t)
    monkeypatch.setattr(fd, "CHUNK_ROWS", 2)  # our own constant: 4 chunks instead of 1
    assert fd.fingerprint_tensor(t) == whole
