"""all_to_all_bytes and the sharded exchange between real processes over gloo (TorchDistCommunicator)."""

from __future__ import annotations

from typing import Any

import pytest
from _a2a_worker import run_rank
from _ranks import run_ranks


def _run(world: int, shared_memory: bool, timeout_case: bool = False) -> list[dict[str, Any]]:
    return run_ranks(run_rank, world, shared_memory, timeout_case)


@pytest.mark.parametrize("shared_memory", [False, True])
def test_all_to_all_bytes_and_sharded_exchange_over_gloo(shared_memory: bool) -> None:
    world = 3
    reports = _run(world, shared_memory)
    for me, r in enumerate(reports):
        assert r["received"] == [bytes([src, me]) * (src * me) for src in range(world)]
        for plain_active, sharded_active in r["active"]:
            assert plain_active == sharded_active
        assert all(s in (True, None) for s in r["same"]), r["same"]
        assert any(s is True for s in r["same"])
        assert r["digests"] == reports[0]["digests"]  # every rank assembled the same sums


def test_all_to_all_bytes_times_out_with_an_actionable_message() -> None:
    reports = _run(2, shared_memory=False, timeout_case=True)
    error = reports[0]["error"]
    assert error is not None and "rendezvous_timeout_s=3.0" in error, error
