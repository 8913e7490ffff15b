"""The one-pass CPU encode (numba, ``torchspark[fast]``): bit-equal to the numpy path, used, and its fallback."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator

import pytest
import torch

from torchspark.encoding import (
    EncoderConfig,
    EncoderState,
    FixedThreshold,
    encode_step,
    fast_path_status,
    fastpath,
    threshold_encode,
    to_bytes,
)
from torchspark.errors import EncodingError

pytest.importorskip("numba")  # the [test] extra installs it; without numba every CPU encode is the numpy path

BLOCK = 64  # the kernel's block: sizes around it and its multiples


def encode_both(
    residual: torch.Tensor, update: torch.Tensor | None, t: float, **kw: object
) -> tuple[tuple[bytes, torch.Tensor], tuple[bytes, torch.Tensor]]:
    """(message bytes, residual after) from the one-pass kernel and from the numpy path, on copies of ``residual``."""
    out = []
    for one_pass in (True, False):
        r = residual.clone()
        msg = threshold_encode(update, r, t, _one_pass=one_pass, **kw)  # type: ignore[arg-type]
        out.append((to_bytes(msg), r))
    return out[0], out[1]


def assert_bit_equal(residual: torch.Tensor, update: torch.Tensor | None, t: float, **kw: object) -> bytes:
    (ours, r_ours), (ref, r_ref) = encode_both(residual, update, t, **kw)
    assert ours == ref
    assert r_ours.view(torch.int32).equal(r_ref.view(torch.int32))  # bits: NaN payloads and -0.0 included
    return ours


@pytest.mark.parametrize("n", [0, 1, 5, BLOCK - 1, BLOCK, BLOCK + 1, 1000, 70_001])
@pytest.mark.parametrize("scale", [0.0, 0.05, 0.4, 1.0, 100.0])  # empty, ~0.1%-ish, sparse, bitmap, all above
@pytest.mark.parametrize("with_update", [True, False])
def test_one_pass_is_bit_equal_to_the_numpy_path(n: int, scale: float, with_update: bool) -> None:
    g = torch.Generator().manual_seed(n)
    residual = torch.randn(n, generator=g) * 0.3
    update = torch.randn(n, generator=g) * scale
    if not with_update:
        residual += update
    assert_bit_equal(residual, update if with_update else None, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_pass_widens_half_precision_updates_like_the_numpy_path(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    update = (torch.randn(5000, generator=g) * 0.5).to(dtype)
    assert_bit_equal(torch.zeros(5000), update, 1.0)


@pytest.mark.parametrize("min_entries", [2, 30, 200, 10**9])
@pytest.mark.parametrize("boundary", [None, 1, 7, 150, 400, 2000])
@pytest.mark.parametrize("scale", [0.5, 3.0])  # ~5% (sparse) and ~75% (bitmap) of 4000 elements
def test_one_pass_caps_and_min_entries_like_the_numpy_path(
    min_entries: int, boundary: int | None, scale: float
) -> None:
    """The sparse limit of 4000 elements is 250 entries: boundaries and min_entries below, around and above it."""
    g = torch.Generator().manual_seed(2)
    residual = torch.randn(4000, generator=g) * 0.3
    update = torch.randn(4000, generator=g) * scale
    for upd in (update, None):
        assert_bit_equal(residual, upd, 1.0, min_entries=min_entries, boundary=boundary)


def test_one_pass_handles_nan_inf_and_signed_zeros_like_the_numpy_path() -> None:
    g = torch.Generator().manual_seed(3)
    residual = torch.randn(3000, generator=g)
    residual[::7] = float("nan")
    residual[1::11] = float("inf")
    residual[2::13] = float("-inf")
    residual[3::17] = -0.0
    update = torch.randn(3000, generator=g) * 0.2
    update[5::19] = float("nan")
    for t in (0.5, 2.0, 1e30):
        for upd in (update, None):
            assert_bit_equal(residual, upd, t)


def _pattern(n: int, entries: list[int], t: float = 1.0) -> torch.Tensor:
    """A residual with entries (alternating signs, some exactly at ``±t``) at ``entries`` and small values elsewhere."""
    g = torch.Generator().manual_seed(n + len(entries))
    residual = (torch.rand(n, generator=g) - 0.5) * t  # |r| < t/2: no entry
    for k, i in enumerate(entries):
        sign = 1.0 if k % 2 == 0 else -1.0
        residual[i] = sign * (t if k % 3 == 0 else 1.5 * t)
    return residual


@pytest.mark.parametrize("n", [BLOCK * 3 - 1, BLOCK * 3, BLOCK * 3 + 1, BLOCK * 5 + 17])
@pytest.mark.parametrize(
    "where",
    ["none", "all", "first of each block", "last of each block", "whole middle block", "last element"],
)
def test_one_pass_matches_the_numpy_path_at_block_boundaries(n: int, where: str) -> None:
    """The kernel works on 64-element blocks (a 64-bit mask each) and a shorter last block: entries on the first and
    last bit of blocks, a full block, every element, none, and the very last element."""
    entries = {
        "none": [],
        "all": list(range(n)),
        "first of each block": list(range(0, n, BLOCK)),
        "last of each block": list(range(BLOCK - 1, n, BLOCK)) + [n - 1],
        "whole middle block": list(range(BLOCK, 2 * BLOCK)),
        "last element": [n - 1],
    }[where]
    residual = _pattern(n, sorted(set(entries)))
    for min_entries in (1, 2):
        assert_bit_equal(residual, None, 1.0, min_entries=min_entries)
        assert_bit_equal(residual * 0.5, residual * 0.5, 1.0, min_entries=min_entries)  # the add makes them


@pytest.mark.parametrize("extra", [0, 1, 2, BLOCK - 1, BLOCK, 3 * BLOCK + 5])
def test_one_pass_switches_from_sparse_to_bitmap_anywhere_like_the_numpy_path(extra: int) -> None:
    """A message that passes the sparse limit (N/16 entries) in some block: the sparse entries so far become the
    bitmap mid-pass. ``extra`` entries beyond the limit, spread over the rest of the update."""
    n = 64 * BLOCK + 9
    limit = (n + 3) // 4 // 4
    first = list(range(0, 8 * (limit - 1), 8))  # limit - 1 entries, every 8th element of the first half
    rest = torch.linspace(8 * limit, n - 1, extra + 1).long().tolist()  # extra + 1 entries in the second half
    residual = _pattern(n, sorted(set(first + rest)))
    assert threshold_encode(None, residual.clone(), 1.0).format == ("sparse" if extra == 0 else "bitmap")
    assert_bit_equal(residual, None, 1.0)
    for boundary in (limit, limit + 1, limit + extra):
        assert_bit_equal(residual, None, 1.0, boundary=boundary)


@pytest.mark.parametrize("n", [BLOCK + 3, 4 * BLOCK])
def test_one_pass_handles_special_values_on_block_edges_like_the_numpy_path(n: int) -> None:
    """NaN (both signs), ±inf, ±0 and values exactly at ``±t`` on the first and last bit of blocks and in the tail."""
    specials = [float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0]
    edges = sorted({0, BLOCK - 1, BLOCK, n - 1, n - 2, n - 3, n - 4, n - 5})
    for shift in range(len(specials)):
        residual = _pattern(n, [])
        for k, i in enumerate(edges):
            residual[i] = specials[(k + shift) % len(specials)]
        update = torch.zeros(n)
        update[edges[::2]] = 0.75
        for upd in (update, None):
            for t in (1.0, 0.5):
                assert_bit_equal(residual, upd, t)


def test_non_contiguous_input_is_refused_on_both_paths() -> None:
    update = torch.randn(200)[::2]
    for one_pass in (True, False):
        with pytest.raises(EncodingError, match="contiguous"):
            threshold_encode(update, torch.zeros(100), 1.0, _one_pass=one_pass)


def test_encodes_run_on_the_kernel_when_it_is_available() -> None:
    status = fast_path_status()
    assert status.available, status.reason
    assert status.backend.startswith("numba ")
    before = status.encodes
    update = torch.randn(1000)
    threshold_encode(update, torch.zeros(1000), 1.0)
    assert fast_path_status().encodes == before + 1
    state = EncoderState.create(EncoderConfig(threshold_policy=FixedThreshold(1.0)), 1000)
    encode_step(update, state, 0)  # what a sharing worker calls every step
    assert fast_path_status().encodes == before + 2
    threshold_encode(update, torch.zeros(1000), 1.0, _one_pass=False)  # the numpy path
    threshold_encode(update, torch.zeros(1000), 1.0, _force_torch=True)  # the torch path (CUDA's)
    assert fast_path_status().encodes == before + 2


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The kernel loaded again under the test's import blocks; the real kernel back afterwards."""
    fastpath.loaded_kernel.cache_clear()
    try:
        yield monkeypatch
    finally:
        monkeypatch.undo()
        fastpath.loaded_kernel.cache_clear()


@pytest.mark.parametrize(
    ("blocked", "level", "says"),
    [
        ("numba", logging.INFO, "numba is not installed"),
        ("torchspark.encoding._onepass_kernel", logging.WARNING, "cannot run the one-pass kernel"),
    ],
)
def test_without_a_usable_numba_the_numpy_path_runs_and_says_why_once(
    fresh_loader: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, blocked: str, level: int, says: str
) -> None:
    fresh_loader.setitem(sys.modules, blocked, None)  # `import blocked` raises ImportError, as when not installed
    g = torch.Generator().manual_seed(4)
    update = torch.randn(5000, generator=g)
    expected = [to_bytes(threshold_encode(update, torch.zeros(5000), t, _one_pass=False)) for t in (0.5, 3.0)]
    with caplog.at_level(logging.INFO, logger="torchspark.encoding.fastpath"):
        got = []
        for t in (0.5, 3.0, 0.5):
            got.append(to_bytes(threshold_encode(update, torch.zeros(5000), t)))
    assert got == [expected[0], expected[1], expected[0]]
    records = [r for r in caplog.records if r.name == "torchspark.encoding.fastpath"]
    assert len(records) == 1 and records[0].levelno == level and says in records[0].getMessage()
    status = fast_path_status()
    assert not status.available and status.backend == "numpy" and says in (status.reason or "")
