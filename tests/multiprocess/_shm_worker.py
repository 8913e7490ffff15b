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
    from torchspark.training.comm import TorchDistCommunicator, shm

    if shm_dir is not None:
        shm.SHM_DIR = shm_dir
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
    comm = TorchDistCommunicator(store, rank, world, "gloo", "cpu", 60.0, shared_memory=shared_memory)
    report: dict[str, Any] = {
        "rank": rank,
        "shm": comm.uses_shared_memory,
        "ok": [],
        "digest": [],
        "fifo": comm._fifo is not None,
    }
    cases: list[tuple[tuple[int, ...], bool]] = [
        ((100_003,), False),
        ((400_001,), False),
        ((50,), False),
        ((700, 300), True),
    ]
    for seed, (shape, transposed) in enumerate(cases):
        t = _values(shape, rank, seed)
        if transposed:  # a non-contiguous view
            t = t.t().contiguous().t()
        comm.all_reduce_sum(t)
        report["ok"].append(bool(torch.allclose(t, _expected(shape, world, seed), atol=1e-5)))
        report["digest"].append(hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest())
    # staged sums: input written in place, result read in place; a larger plain sum in between grows (replaces)
    # the segment, and the staged sum must follow it; a small one stays on the portable path
    from torchspark.training.comm import StagedSum, staged_sum

    report["staged_kind"] = []
    for seed, numel in ((10, 200_000), (11, 900_000), (12, 200_000), (13, 100)):
        staged = staged_sum(comm, numel)
        report["staged_kind"].append(type(staged).__name__)
        for rep in range(2):
            buf = staged.buffer()
            buf.copy_(_values((numel,), rank, seed * 10 + rep))
            total = staged.reduce()
            report["ok"].append(bool(torch.allclose(total, _expected((numel,), world, seed * 10 + rep), atol=1e-5)))
            report["digest"].append(hashlib.sha256(total.contiguous().numpy().tobytes()).hexdigest())
        if seed == 11:
            big = _values((1_500_000,), rank, 99)
            comm.all_reduce_sum(big)  # grows the segment past the staged sum's
            report["ok"].append(bool(torch.allclose(big, _expected((1_500_000,), world, 99), atol=1e-5)))
    # byte gathers: varying lengths, an empty payload, one rank's payload far larger than the slots (every rank
    # grows the segment), and a float sum in between
    report["gather_ok"] = []
    for seed, sizes in enumerate(([10, 3000, 0], [8_000_000, 7, 1], [0, 0, 0], [64, 2_000_000, 65])):
        payloads = [
            bytes([(r * 31 + seed + i) % 256 for i in range(min(n, 256))]) * (n // 256 + 1)
            for r, n in enumerate(sizes[:world])
        ]
        payloads = [p_[:n] for p_, n in zip(payloads, sizes[:world])]
        got = comm.all_gather_bytes(payloads[rank])
        report["gather_ok"].append(got == payloads)
        if seed == 1:
            t = _values((300_000,), rank, 77)
            comm.all_reduce_sum(t)
            report["gather_ok"].append(bool(torch.allclose(t, _expected((300_000,), world, 77), atol=1e-5)))
    # posted (split-phase) gathers: post, do other work, collect; ranks take turns being slow between post and
    # collect, payload sizes vary by round (one far larger than a half slot: all grow the segment mid-run), and a
    # float sum after close reuses the segment
    posted = comm.posted_gathers()
    report["posted"] = posted is not None
    report["posted_ok"] = []
    if posted is not None:
        import time

        sizes = [5, 0, 70_000, 3, 1_500_000, 9, 0, 200_000] * 3
        for t, n in enumerate(sizes):
            payloads = [
                bytes([(r * 7 + t + i) % 256 for i in range(max(n - r, 0) % 256)]) * ((n - r) // 256 + 1)
                for r in range(world)
            ]
            payloads = [q[: max(n - r, 0)] for r, q in enumerate(payloads)]
            posted.post(payloads[rank])
            if t % world == rank:
                time.sleep(0.02)  # this rank is the slow one of the round: peers are one post ahead meanwhile
            report["posted_ok"].append(posted.collect() == payloads)
        try:
            posted.collect()
            report["posted_ok"].append(False)
        except RuntimeError:  # collect without post
            report["posted_ok"].append(True)
        posted.close()
        t_ = _values((300_000,), rank, 78)
        comm.all_reduce_sum(t_)
        report["posted_ok"].append(bool(torch.allclose(t_, _expected((300_000,), world, 78), atol=1e-5)))
    seg = comm._shm._segment if comm._shm is not None else None
    report["slot_bytes"] = seg.capacity * 4 if seg is not None else 0
    report["staged_is_base"] = [k == StagedSum.__name__ for k in report["staged_kind"]]
    report["segments_left"] = glob.glob(os.path.join(shm.SHM_DIR, f"torchspark-{os.getpid()}-*"))
    report["shm_after"] = comm.uses_shared_memory
    comm.close()
    out.put(report)
