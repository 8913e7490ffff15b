"""The exchange cost model of docs/scaling.md (benchmarks/scaling_model.py): the formulas and the crossovers."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))

import scaling_model as M  # noqa: E402

LINK = M.Link(bandwidth=125e6, latency=50e-6)


def test_dense_ring_matches_the_formula_by_hand() -> None:
    rates = M.Rates(add_float=0.0)
    # N = 4, L = 1e6: 2 * 3/4 * 4e6 / 125e6 + 2 * 3 * 50e-6
    assert M.dense_ring_s(4, 1e6, LINK, rates) == pytest.approx(0.048 + 0.0003)
    assert M.dense_ring_s(1, 1e6, LINK, rates) == 0.0


def test_all_gather_matches_the_formula_by_hand() -> None:
    rates = M.Rates(sum_entry=40e-9, apply_entry=5e-9, per_message=1e-4)
    k = 1e-3 * 1e6  # 1,000 entries, sparse: 4,000 + header bytes
    m = 4 * k + M.HEADER_BYTES
    # two ring all-gathers (sizes, messages): 2 latencies per hop; the N messages merged into the union sum
    expected = 3 * (2 * 50e-6 + m / 125e6) + 4 * (1e-4 + k * 40e-9) + 4 * k * 5e-9
    assert M.all_gather_s(4, 1e6, 1e-3, LINK, rates) == pytest.approx(expected)


def test_all_gather_of_bitmaps_sums_into_a_fresh_dense_buffer() -> None:
    rates = M.Rates(bitmap_element=1e-9, fresh_element=2e-9, add_float=0.5e-9, per_message=1e-4)
    m = 1e6 / 4 + M.HEADER_BYTES  # 20% density: the bitmap is smaller
    expected = 3 * (2 * 50e-6 + m / 125e6) + 4 * (1e-4 + 1e6 * 1e-9) + 1e6 * (2e-9 + 0.5e-9)
    assert M.all_gather_s(4, 1e6, 0.2, LINK, rates) == pytest.approx(expected)


def test_sharded_matches_the_formula_by_hand() -> None:
    rates = M.Rates(
        decode_entry=10e-9, apply_entry=5e-9, copy_element=1e-9, add_float=0.5e-9, fresh_element=2e-9, per_message=1e-4
    )
    n, length, k = 4, 1e6, 1e3
    m, shard, union = 4 * k + M.HEADER_BYTES, length / n, n * k
    sums = 8 * union / n + M.HEADER_BYTES  # sparse shard sums: 8 bytes per entry beat the dense 4 L / N
    expected = (
        2 * 3 * 50e-6
        + 3 / 4 * m / 125e6  # all-to-all of sizes and pieces
        + n * 1e-4
        + k * 10e-9
        + shard * (2e-9 + 1e-9)  # pieces decoded into a fresh shard, scanned
        + 3 * (2 * 50e-6 + sums / 125e6)  # all-gather of the shard sums
        + n * 1e-4
        + union * 10e-9  # S_t kept as values at the union's indices
        + union * 5e-9
    )  # applied there
    assert M.sharded_s(n, length, 1e-3, LINK, rates) == pytest.approx(expected)


def test_sharded_with_dense_shard_sums_assembles_a_fresh_buffer() -> None:
    rates = M.Rates(bitmap_element=1e-9, copy_element=1e-9, add_float=0.5e-9, fresh_element=2e-9, per_message=1e-4)
    n, length = 4, 1e6
    m, shard = length / 4 + M.HEADER_BYTES, length / n  # 20% density: bitmap messages, dense shard sums
    sums = 4 * shard + M.HEADER_BYTES
    expected = (
        2 * 3 * 50e-6
        + 3 / 4 * m / 125e6
        + n * 1e-4
        + length * 1e-9
        + shard * (2e-9 + 1e-9)
        + 3 * (2 * 50e-6 + sums / 125e6)
        + n * 1e-4
        + length * (2e-9 + 1e-9)  # assembled in a fresh dense S_t
        + length * 0.5e-9
    )  # applied densely
    assert M.sharded_s(n, length, 0.2, LINK, rates) == pytest.approx(expected)


def test_messages_switch_to_the_bitmap_when_it_is_smaller() -> None:
    assert M.message_bytes(1e6, 1e-3) == 4_000 + M.HEADER_BYTES
    assert M.message_bytes(1e6, 0.2) == 250_000 + M.HEADER_BYTES  # 2 bits per parameter beats 4 bytes per entry


@pytest.mark.parametrize("density", [1e-3, 1e-2, 0.1])
def test_costs_grow_with_the_worker_count(density: float) -> None:
    for cost in (M.all_gather_s, M.sharded_s):
        # from 4 workers: at 2, sharded's fresh half-size shard buffer can cost more than the second peer
        times = [cost(n, 3.7e6, density, LINK) for n in (4, 8, 16, 64, 256, 1000)]
        assert times == sorted(times)
    # sharded stays bounded by about one dense copy per step; all-gather grows with N
    assert M.sharded_s(1000, 3.7e6, 0.1, LINK) < 5 * M.dense_ring_s(1000, 3.7e6, LINK)
    assert M.all_gather_s(1000, 3.7e6, 0.1, LINK) > 20 * M.dense_ring_s(1000, 3.7e6, LINK)


def test_crossover_is_the_first_worker_count_where_the_second_is_faster() -> None:
    n = M.crossover(M.all_gather_s, M.sharded_s, 3.7e6, 1e-2, LINK)
    assert n is not None
    assert M.sharded_s(n, 3.7e6, 1e-2, LINK) < M.all_gather_s(n, 3.7e6, 1e-2, LINK)
    assert M.sharded_s(n - 1, 3.7e6, 1e-2, LINK) >= M.all_gather_s(n - 1, 3.7e6, 1e-2, LINK)
    # sparser messages shard later (0.1%: hundreds of workers); tiny ones never within the limit
    assert M.crossover(M.all_gather_s, M.sharded_s, 3.7e6, 1e-3, LINK, limit=5000) > 10 * n
    assert M.crossover(M.all_gather_s, M.sharded_s, 3.7e6, 1e-4, LINK, limit=2000) is None


def test_sharded_scatters_sparse_shard_sums_into_a_fresh_buffer_above_the_sparse_apply_fraction() -> None:
    rates = M.Rates(
        decode_entry=10e-9, apply_entry=5e-9, copy_element=1e-9, add_float=0.5e-9, fresh_element=2e-9, per_message=1e-4
    )
    n, length, density = 4, 1e6, 0.05  # union 20% > 1/8, but 8 bytes per entry still beat the dense shard
    k, shard = density * length, length / n
    m, union = 4 * k + M.HEADER_BYTES, n * k
    sums = 8 * union / n + M.HEADER_BYTES
    expected = (
        2 * 3 * 50e-6
        + 3 / 4 * m / 125e6
        + n * 1e-4
        + k * 10e-9
        + shard * (2e-9 + 1e-9)
        + 3 * (2 * 50e-6 + sums / 125e6)
        + n * 1e-4
        + length * 2e-9
        + union * 10e-9  # fresh dense S_t, the sums scattered at their indices
        + length * 0.5e-9
    )  # applied densely
    assert M.sharded_s(n, length, density, LINK, rates) == pytest.approx(expected)
