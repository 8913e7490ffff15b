"""Shared-memory all-reduce between processes of one host: exact sums, bit-identical ranks, gloo fallback."""

from __future__ import annotations

from typing import Any

import pytest
from _ranks import run_ranks
from _shm_worker import run_rank


def _run(world: int, shared_memory: bool = True, shm_dir: str | None = None) -> list[dict[str, Any]]:
    return run_ranks(run_rank, world, shared_memory, shm_dir, check_exit=True)


@pytest.mark.parametrize("world", [2, 3])
def test_shared_memory_sums_are_exact_and_identical_on_every_rank(world: int) -> None:
    reports = _run(world)
    for r in reports:
        assert r["shm"] and r["shm_after"], "co-located ranks must use the shared-memory path"
        assert r["fifo"], "and order it with the FIFO barrier"
        assert all(r["ok"]), r["ok"]  # grown segment, small (gloo) and non-contiguous tensors included
        assert all(r["gather_ok"]), r["gather_ok"]  # byte gathers through the segment, growth included
        # posted gathers: every round exact (slow ranks, a payload larger than a half slot), a sum after close
        assert r["posted"] and len(r["posted_ok"]) == 26 and all(r["posted_ok"]), r["posted_ok"]
        assert r["slot_bytes"] >= 8 + 8_000_000, "the 8 MB payload grew the segment (larger than any sum before)"
        assert r["segments_left"] == [], "segments are unlinked as soon as every rank has mapped them"
        # staged sums of >= MIN_NUMEL values use the shared segment; 100 values stay on gloo
        assert r["staged_is_base"] == [False, False, False, True], r["staged_kind"]
    assert all(r["digest"] == reports[0]["digest"] for r in reports), "results must be bit-identical across ranks"


def test_without_dev_shm_every_rank_falls_back_to_gloo(tmp_path) -> None:
    reports = _run(2, shm_dir=str(tmp_path / "missing"))
    for r in reports:
        assert not r["shm"] and not r["fifo"]
        assert all(r["ok"])
        assert all(r["staged_is_base"]), "without shared memory every staged sum is the portable one"
        assert all(r["gather_ok"]), "byte gathers fall back to gloo"
        assert not r["posted"], "posted gathers need the shared segment: the sharing loop keeps its thread"
    assert reports[0]["digest"] == reports[1]["digest"]


def test_switched_off_uses_gloo() -> None:
    reports = _run(2, shared_memory=False)
    assert [r["shm"] for r in reports] == [False, False]
    assert all(all(r["ok"]) and all(r["staged_is_base"]) and all(r["gather_ok"]) for r in reports)
