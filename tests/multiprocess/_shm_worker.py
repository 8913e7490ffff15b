"""Child side of test_shm_allreduce: one rank summing tensors through TorchDistCommunicator."""

from __future__ import annotations

import datetime
import glob
import hashlib
import os
from typing import Any

import torch
import torch.distributed as dist


def _expected(shape: tuple[int, ...], world: int, seed: int) -> torch.Tensor:
    total = torch.zeros(shape)
    for r in range(world):
        total += _values(shape, r, seed)
    return total


def _values(shape: tuple[int, ...], rank: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return torch.randn(shape, generator=g)


def run_rank(rank: int, world: int, port: int, shared_memory: bool, shm_dir: str | None, out: Any) -> None:
    from torchspark.training import shm
    from torchspark.training.comm import TorchDistCommunicator

    if shm_dir is not None:
        shm.SHM_DIR = shm_dir
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
    comm = TorchDistCommunicator(store, rank, world, "gloo", "cpu", 60.0, shared_memory=shared_memory)
    report: dict[str, Any] = {"rank": rank, "shm": comm.uses_shared_memory, "ok": [], "digest": []}
    cases: list[tuple[tuple[int, ...], bool]] = [((100_003,), False), ((400_001,), False), ((50,), False),
                                                 ((700, 300), True)]
    for seed, (shape, transposed) in enumerate(cases):
        t = _values(shape, rank, seed)
        if transposed:  # a non-contiguous view
            t = t.t().contiguous().t()
        comm.all_reduce_sum(t)
        report["ok"].append(bool(torch.allclose(t, _expected(shape, world, seed), atol=1e-5)))
        report["digest"].append(hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest())
    report["segments_left"] = glob.glob(os.path.join(shm.SHM_DIR, f"torchspark-{os.getpid()}-*"))
    report["shm_after"] = comm.uses_shared_memory
    comm.close()
    out.put(report)
