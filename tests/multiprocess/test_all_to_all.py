"""all_to_all_bytes and the sharded exchange between real processes over gloo (TorchDistCommunicator)."""

from __future__ import annotations

import multiprocessing
import socket
from typing import Any

import pytest
from _a2a_worker import run_rank

pytestmark = pytest.mark.multiprocess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(world: int, shared_memory: bool, timeout_case: bool = False) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=run_rank, args=(r, world, port, shared_memory, timeout_case, out), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        reports = [out.get(timeout=180) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return sorted(reports, key=lambda r: r["rank"])


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
