"""Threshold codec: reference semantics, format choice, nothing lost, CPU numpy path vs torch path vs CUDA."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from torchspark.encoding import (
    EncodedUpdate,
    EncodingStats,
    decode,
    decode_sum,
    from_bytes,
    threshold_encode,
    to_bytes,
)
from torchspark.encoding._kernels import _CHUNK
from torchspark.encoding.codec import HEADER_NBYTES
from torchspark.errors import ConfigError, EncodingError

PATHS = [False, True]  # _force_torch: numpy CPU path, generic torch path (what CUDA runs)


def reference(residual: torch.Tensor, update: torch.Tensor | None, t: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A few-line reference: (decoded steps, residual after) for one encode."""
    r = residual.clone() if update is None else residual + update
    steps = torch.where(r.abs() >= t, torch.sign(r) * t, torch.zeros_like(r))
    return steps, r - steps


@pytest.mark.parametrize("force_torch", PATHS)
@pytest.mark.parametrize("n", [1, 7, 1000, 3 * _CHUNK + 5])
@pytest.mark.parametrize("scale", [0.3, 3.0])  # low density -> sparse, high density -> bitmap
def test_encode_matches_reference_and_round_trips(force_torch: bool, n: int, scale: float) -> None:
    g = torch.Generator().manual_seed(n)
    residual = torch.randn(n, generator=g) * 0.5
    update = torch.randn(n, generator=g) * scale
    t = 1.0
    steps, r_after = reference(residual, update, t)
    msg = threshold_encode(update, residual, t, _force_torch=force_torch)
    assert residual.equal(r_after)
    assert msg.num_entries == int((steps != 0).sum())
    if msg.format != "empty":
        assert msg.format == ("bitmap" if 4 * msg.num_entries > (n + 3) // 4 else "sparse")
    for m in (msg, from_bytes(to_bytes(msg))):
        assert decode(m, torch.zeros(n), _force_torch=force_torch).equal(steps)
    assert len(to_bytes(msg)) == msg.nbytes


@pytest.mark.parametrize("find_chunk", [1000, 1 << 20])  # several search chunks, or one
@pytest.mark.parametrize("scale", [0.3, 3.0])
def test_encode_without_update_matches_reference_in_any_chunking(
    monkeypatch: pytest.MonkeyPatch, find_chunk: int, scale: float
) -> None:
    """The training loop's encode (``update=None``: the updater stepped into the residual) searches in its own,
    larger chunks: every chunking gives the reference's message and residual."""
    from torchspark.encoding import _kernels

    monkeypatch.setattr(_kernels, "_FIND_CHUNK", find_chunk)
    n = 3 * 1000 + 5
    residual = torch.randn(n, generator=torch.Generator().manual_seed(7)) * scale
    steps, r_after = reference(residual, None, 1.0)
    msg = threshold_encode(None, residual, 1.0)
    assert residual.equal(r_after)
    assert msg.num_entries == int((steps != 0).sum()) > 0
    assert decode(msg, torch.zeros(n)).equal(steps)


def test_sparse_payload_is_sorted_signed_one_based() -> None:
    residual = torch.zeros(100)
    update = torch.zeros(100)
    update[[3, 50, 97]] = torch.tensor([-2.0, 1.0, 5.0])
    msg = threshold_encode(update, residual, 1.0)
    assert msg.format == "sparse"
    assert msg.payload.dtype == torch.int32
    assert msg.payload.tolist() == [-4, 51, 98]
    # exactly one step per entry even when |r| >= 2t; the rest stays in the residual
    assert residual[[3, 50, 97]].tolist() == [-1.0, 0.0, 4.0]


@pytest.mark.parametrize("count", [60, 61, 62, 63, 64, 65])
def test_bitmap_chosen_exactly_when_smaller(count: int) -> None:
    n = 1000  # bitmap payload 250 bytes; sparse payload 4*count bytes
    update = torch.zeros(n)
    update[torch.randperm(n, generator=torch.Generator().manual_seed(count))[:count]] = 1.0
    msg = threshold_encode(update, torch.zeros(n), 0.5)
    sparse_bytes, bitmap_bytes = HEADER_NBYTES + 4 * count, HEADER_NBYTES + 250
    assert msg.format == ("bitmap" if bitmap_bytes < sparse_bytes else "sparse")
    assert msg.nbytes == min(sparse_bytes, bitmap_bytes) == len(to_bytes(msg))
    assert msg.num_entries == count


@pytest.mark.parametrize("force_torch", PATHS)
def test_empty_when_nothing_reaches_threshold(force_torch: bool) -> None:
    update = torch.full((50,), 0.1)
    residual = torch.zeros(50)
    msg = threshold_encode(update, residual, 1.0, _force_torch=force_torch)
    assert msg.format == "empty" and msg.num_entries == 0 and msg.nbytes == HEADER_NBYTES
    assert residual.equal(update)  # accumulated, nothing subtracted
    assert decode(msg, torch.zeros(50)).equal(torch.zeros(50))
    # fewer than min_entries: residual keeps the entries that did reach t
    residual = torch.zeros(50)
    update[[1, 2]] = 2.0
    msg = threshold_encode(update, residual, 1.0, min_entries=3, _force_torch=force_torch)
    assert msg.format == "empty" and residual.equal(update)


def test_update_none_encodes_residual_alone() -> None:
    residual = torch.tensor([1.5, -0.2, -3.0, 0.0])
    msg = threshold_encode(None, residual, 1.0)
    assert decode(msg, torch.zeros(4)).tolist() == [1.0, 0.0, -1.0, 0.0]
    assert_close(residual, torch.tensor([0.5, -0.2, -2.0, 0.0]))


@pytest.mark.parametrize("force_torch", PATHS)
@pytest.mark.parametrize("scale,expected_format", [(0.05, "sparse"), (2.0, "bitmap")])
def test_nothing_lost_over_200_steps(force_torch: bool, scale: float, expected_format: str) -> None:
    n, t = 3000, 1.0
    g = torch.Generator().manual_seed(7)
    residual = torch.zeros(n)
    total_updates = torch.zeros(n, dtype=torch.float64)
    total_decoded = torch.zeros(n, dtype=torch.float64)
    formats = set()
    for _ in range(200):
        update = torch.randn(n, generator=g) * scale
        total_updates += update.double()
        msg = threshold_encode(update, residual, t, _force_torch=force_torch)
        formats.add(msg.format)
        total_decoded += decode(from_bytes(to_bytes(msg)), torch.zeros(n)).double()
    assert expected_format in formats
    assert_close(total_decoded + residual.double(), total_updates, atol=1e-4, rtol=1e-5)


def test_numpy_and_torch_paths_are_bit_identical_over_steps() -> None:
    n = 2 * _CHUNK + 3
    g = torch.Generator().manual_seed(3)
    r_np, r_t = torch.zeros(n), torch.zeros(n)
    for k in range(6):
        update = torch.randn(n, generator=g) * (0.2 if k % 2 else 2.0)
        a = threshold_encode(update, r_np, 0.7)
        b = threshold_encode(update, r_t, 0.7, _force_torch=True)
        assert (a.format, a.num_entries) == (b.format, b.num_entries)
        assert a.payload.equal(b.payload)
        assert r_np.equal(r_t)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_agree() -> None:
    n = 2 * _CHUNK + 3
    g = torch.Generator().manual_seed(5)
    r_cpu, r_gpu = torch.zeros(n), torch.zeros(n, device="cuda")
    for k in range(4):
        update = torch.randn(n, generator=g) * (0.2 if k % 2 else 2.0)
        a = threshold_encode(update, r_cpu, 0.7)
        b = threshold_encode(update.cuda(), r_gpu, 0.7)
        assert a.format == b.format and a.payload.equal(b.payload.cpu())
        assert_close(r_cpu, r_gpu.cpu())
        assert decode(b, torch.zeros(n, device="cuda")).cpu().equal(decode(a, torch.zeros(n)))


def test_decode_sum_adds_messages_with_different_thresholds() -> None:
    r1, r2 = torch.zeros(4), torch.zeros(4)
    m1 = threshold_encode(torch.tensor([1.0, 0.0, -1.0, 0.0]), r1, 0.5)
    m2 = threshold_encode(torch.tensor([0.0, 2.0, -2.0, 0.0]), r2, 2.0)
    assert decode_sum([m1, m2], torch.zeros(4)).tolist() == [0.5, 2.0, -2.5, 0.0]


def test_decode_length_mismatch_names_both_lengths() -> None:
    msg = threshold_encode(torch.ones(10), torch.zeros(10), 0.5)
    with pytest.raises(EncodingError, match=r"10.*\b9\b"):
        decode(msg, torch.zeros(9))


@pytest.mark.parametrize("threshold", [0.0, -1.0, float("nan"), float("inf"), 1e-50])
def test_invalid_threshold_is_config_error(threshold: float) -> None:
    with pytest.raises(ConfigError, match="threshold"):
        threshold_encode(torch.ones(3), torch.zeros(3), threshold)


def test_bad_tensors_are_rejected() -> None:
    with pytest.raises(EncodingError, match="4 elements.*3"):
        threshold_encode(torch.ones(4), torch.zeros(3), 0.5)
    with pytest.raises(EncodingError, match="float32"):
        threshold_encode(None, torch.zeros(3, dtype=torch.float64), 0.5)
    with pytest.raises(EncodingError, match="1-D"):
        threshold_encode(None, torch.zeros(3, 2), 0.5)
    with pytest.raises(ConfigError, match="min_entries"):
        threshold_encode(None, torch.zeros(3), 0.5, min_entries=0)


def test_stats_from_message() -> None:
    update = torch.zeros(1000)
    update[:5] = 1.0
    msg = threshold_encode(update, torch.zeros(1000), 0.5)
    stats = EncodingStats.from_message(msg)
    assert stats.entries == 5 and stats.sparsity == 0.005 and stats.format == "sparse"
    assert stats.nbytes == HEADER_NBYTES + 20 and stats.threshold == 0.5
    assert stats.to_dict()["entries"] == 5
    assert isinstance(msg, EncodedUpdate) and msg.density == 0.005


def capped_reference(
    residual: torch.Tensor, update: torch.Tensor, t: float, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for ``boundary=k``: only the first ``k`` entries (by index) with ``|r| >= t`` take a step."""
    steps, _ = reference(residual, update, t)
    over = torch.nonzero(steps).squeeze(1)[k:]
    steps[over] = 0.0
    return steps, residual + update - steps


@pytest.mark.parametrize("force_torch", PATHS)
@pytest.mark.parametrize(("n", "boundary"), [(10, 3), (1000, 100)])
def test_boundary_on_all_ones_leaves_the_rest_in_the_residual(force_torch: bool, n: int, boundary: int) -> None:
    """DL4J's boundary cases: n ones, threshold 1, boundary k -> k entries sent, sum n - k left behind."""
    residual = torch.ones(n)
    msg = threshold_encode(None, residual, 1.0, boundary=boundary, _force_torch=force_torch)
    assert msg.num_entries == boundary
    assert float(residual.sum()) == n - boundary
    assert residual[:boundary].eq(0).all() and residual[boundary:].eq(1).all()  # the first k by index go out
    assert decode(msg, torch.zeros(n)).sum() == boundary
    uncapped = threshold_encode(None, torch.ones(n), 1.0, boundary=n, _force_torch=force_torch)
    assert uncapped.num_entries == n  # a boundary at or above the count changes nothing


@pytest.mark.parametrize("force_torch", PATHS)
@pytest.mark.parametrize("boundary", [1, 5, 40, 300, 5000])  # sparse, sparse, bitmap, bitmap, uncapped
def test_boundary_matches_reference_in_both_formats(force_torch: bool, boundary: int) -> None:
    n = 2000
    g = torch.Generator().manual_seed(boundary)
    residual = torch.randn(n, generator=g) * 0.5
    update = torch.randn(n, generator=g)
    reaching = int((reference(residual, update, 1.0)[0] != 0).sum())  # ~630 entries reach t
    steps, r_after = capped_reference(residual, update, 1.0, boundary)
    msg = threshold_encode(update, residual, 1.0, boundary=boundary, _force_torch=force_torch)
    assert residual.equal(r_after)
    assert msg.num_entries == min(boundary, reaching)
    assert msg.format == ("bitmap" if 4 * msg.num_entries > (n + 3) // 4 else "sparse")
    for m in (msg, from_bytes(to_bytes(msg))):
        assert decode(m, torch.zeros(n)).equal(steps)


def test_boundary_is_validated() -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="boundary"):
            threshold_encode(None, torch.ones(4), 1.0, boundary=bad)  # type: ignore[arg-type]
