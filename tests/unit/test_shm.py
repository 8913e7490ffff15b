"""The shared-memory reducer's collective decisions, in one process (the multi-process sums are in
tests/multiprocess/test_shm_allreduce.py)."""

from __future__ import annotations

import os

import pytest
import torch

from torchspark.errors import PeerLost
from torchspark.training.comm import shm


class DictStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]


def test_a_peer_that_cannot_map_the_segment_turns_it_off_everywhere(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))
    votes: list[bool] = []

    def agree(ok: bool) -> bool:  # rank 0 mapped it, the (simulated) peer did not
        votes.append(ok)
        return False

    reducer = shm.SharedMemoryReducer(DictStore(), 0, 2, barrier=lambda: None, agree=agree)
    t = torch.ones(shm.MIN_NUMEL)
    assert reducer.accepts(t)
    assert reducer.all_reduce_sum(t) is False
    assert votes == [True]
    assert reducer.disabled and not reducer.accepts(t)
    assert torch.equal(t, torch.ones(shm.MIN_NUMEL)), "the tensor is untouched when the segment is refused"
    assert os.listdir(tmp_path) == [], "rank 0 removes the segment file it created"


def test_rank0_removes_its_segment_file_when_a_peer_is_lost_while_agreeing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))

    def agree(ok: bool) -> bool:  # the peer's process ended before it voted
        raise PeerLost("a peer worker exited during the agreement")

    reducer = shm.SharedMemoryReducer(DictStore(), 0, 2, barrier=lambda: None, agree=agree)
    with pytest.raises(PeerLost):
        reducer.stage(shm.MIN_NUMEL)
    assert os.listdir(tmp_path) == [], "a segment file left in /dev/shm would outlive every worker"


def test_rank0_without_space_publishes_nothing_and_everyone_falls_back(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path / "not-there"))
    store = DictStore()
    reducer = shm.SharedMemoryReducer(store, 0, 2, barrier=lambda: None, agree=lambda ok: ok)
    assert reducer.all_reduce_sum(torch.ones(shm.MIN_NUMEL)) is False
    assert store.data["torchspark/shm/segment/1"] == b"", "peers learn there is no segment"
    peer = shm.SharedMemoryReducer(store, 1, 2, barrier=lambda: None, agree=lambda ok: ok)
    assert peer.all_reduce_sum(torch.ones(shm.MIN_NUMEL)) is False


def test_only_large_float32_cpu_tensors_take_the_shared_path() -> None:
    reducer = shm.SharedMemoryReducer(DictStore(), 0, 2, barrier=lambda: None, agree=lambda ok: ok)
    assert reducer.accepts(torch.zeros(shm.MIN_NUMEL))
    assert not reducer.accepts(torch.zeros(shm.MIN_NUMEL - 1))
    assert not reducer.accepts(torch.zeros(shm.MIN_NUMEL, dtype=torch.float64))
    assert not reducer.accepts(torch.zeros(shm.MIN_NUMEL, dtype=torch.int64))
