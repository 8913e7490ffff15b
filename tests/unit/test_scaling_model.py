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
    rates = M.Rates(decode_entry=10e-9, apply_entry=5e-9, per_message=1e-4)
    k = 1e-3 * 1e6  # 1,000 entries, sparse: 4,000 + header bytes
    m = 4 * k + M.HEADER_BYTES
    expected = 3 * (50e-6 + m / 125e6) + 4 * (1e-4 + k * 10e-9) + 4 * k * 5e-9
    assert M.all_gather_s(4, 1e6, 1e-3, LINK, rates) == pytest.approx(expected)


def test_messages_switch_to_the_bitmap_when_it_is_smaller() -> None:
    assert M.message_bytes(1e6, 1e-3) == 4_000 + M.HEADER_BYTES
    assert M.message_bytes(1e6, 0.2) == 250_000 + M.HEADER_BYTES  # 2 bits per parameter beats 4 bytes per entry


@pytest.mark.parametrize("density", [1e-3, 1e-2, 0.1])
def test_costs_grow_with_the_worker_count(density: float) -> None:
    for cost in (M.all_gather_s, M.sharded_s):
        times = [cost(n, 3.7e6, density, LINK) for n in (2, 4, 8, 16, 64, 256, 1000)]
        assert times == sorted(times)
    # sharded stays bounded by about one dense copy per step; all-gather grows with N
    assert M.sharded_s(1000, 3.7e6, 0.1, LINK) < 5 * M.dense_ring_s(1000, 3.7e6, LINK)
    assert M.all_gather_s(1000, 3.7e6, 0.1, LINK) > 20 * M.dense_ring_s(1000, 3.7e6, LINK)


def test_crossover_is_the_first_worker_count_where_the_second_is_faster() -> None:
    n = M.crossover(M.all_gather_s, M.sharded_s, 3.7e6, 1e-2, LINK)
    assert n is not None
    assert M.sharded_s(n, 3.7e6, 1e-2, LINK) < M.all_gather_s(n, 3.7e6, 1e-2, LINK)
    assert M.sharded_s(n - 1, 3.7e6, 1e-2, LINK) >= M.all_gather_s(n - 1, 3.7e6, 1e-2, LINK)
    # denser messages shard sooner; tiny ones never within the limit
    assert M.crossover(M.all_gather_s, M.sharded_s, 3.7e6, 0.1, LINK) < n
    assert M.crossover(M.all_gather_s, M.sharded_s, 3.7e6, 1e-4, LINK, limit=2000) is None
