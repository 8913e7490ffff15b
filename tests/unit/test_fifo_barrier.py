"""The FIFO barrier between workers of one host, exercised by threads of one process (the cross-process use is in
tests/multiprocess/test_shm_allreduce.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from torchspark.errors import PeerLost, WaitTimeout
from torchspark.training.comm.fifo_barrier import FifoBarrier


class DictStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key: str, value: str) -> None:
        with self.cond:
            self.data[key] = value.encode()
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.data, timeout=10), key
            return self.data[key]


def _agree_all(world: int) -> Callable[[bool], bool]:
    """A collective AND over ``world`` threads."""
    votes: list[bool] = []
    barrier = threading.Barrier(world, timeout=10)
    lock = threading.Lock()

    def agree(ok: bool) -> bool:
        with lock:
            votes.append(ok)
        barrier.wait()
        result = all(votes)
        barrier.wait()
        with lock:
            votes.clear()
        barrier.wait()
        return result

    return agree


def _create_all(world: int, directory: str, timeout_s: float = 10.0) -> list[FifoBarrier | None]:
    store, agree = DictStore(), _agree_all(world)
    out: list[Any] = [None] * world

    def make(rank: int) -> None:
        out[rank] = FifoBarrier.create(store, rank, world, agree, timeout_s, directory)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_no_rank_passes_before_every_rank_arrived(tmp_path) -> None:
    world, rounds = 3, 200
    barriers = _create_all(world, str(tmp_path))
    assert all(b is not None for b in barriers)
    assert os.listdir(tmp_path) == [], "the FIFO files are unlinked once every rank has opened them"
    arrived = [0] * world
    errors: list[str] = []

    def run(rank: int) -> None:
        b = barriers[rank]
        assert b is not None
        for i in range(rounds):
            arrived[rank] = i + 1
            b.wait()
            if min(arrived) < i + 1:  # a peer has not arrived at barrier i yet
                errors.append(f"rank {rank} passed barrier {i} early: {arrived}")
            b.wait()  # nobody starts the next round before everyone checked

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert arrived == [rounds] * world
    for b in barriers:
        assert b is not None
        b.close()


def test_a_missing_peer_times_out_naming_the_knob(tmp_path) -> None:
    barriers = _create_all(2, str(tmp_path), timeout_s=0.3)
    assert barriers[0] is not None and barriers[1] is not None
    with pytest.raises(WaitTimeout, match="rendezvous_timeout_s=0.3"):
        barriers[0].wait()  # rank 1 never arrives
    for b in barriers:
        b.close()  # type: ignore[union-attr]


def test_a_peer_that_exits_fails_the_wait_at_once(tmp_path) -> None:
    barriers = _create_all(2, str(tmp_path), timeout_s=60)
    assert barriers[0] is not None and barriers[1] is not None
    barriers[1].close()  # the peer's process is gone: its write end closes
    with pytest.raises(PeerLost, match="left the shared-memory barrier"):  # a symptom: runners look for the cause
        barriers[0].wait()
    barriers[0].close()


def test_every_rank_falls_back_when_one_cannot_create_its_fifo(tmp_path) -> None:
    store, agree = DictStore(), _agree_all(2)
    out: list[Any] = ["unset", "unset"]
    dirs = [str(tmp_path), str(tmp_path / "missing")]  # rank 1's directory does not exist

    def make(rank: int) -> None:
        out[rank] = FifoBarrier.create(store, rank, 2, agree, 5.0, dirs[rank])

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == [None, None]
    assert os.listdir(tmp_path) == [], "rank 0 removes the FIFO it made"


def test_a_peer_lost_during_the_set_up_leaves_no_fifo_behind(tmp_path) -> None:
    def agree(ok: bool) -> bool:  # the peer's process ended before it voted
        raise PeerLost("a peer worker exited during the agreement")

    with pytest.raises(PeerLost):
        FifoBarrier.create(DictStore(), 0, 2, agree, 5.0, str(tmp_path))
    assert os.listdir(tmp_path) == [], "a FIFO left in /dev/shm would outlive every worker"
