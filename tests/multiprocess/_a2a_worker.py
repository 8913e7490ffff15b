"""Child side of test_all_to_all: one rank of a gloo group exercising all_to_all_bytes and the sharded exchange."""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist


def run_rank(rank: int, world: int, port: int, shared_memory: bool, timeout_case: bool, out: Any) -> None:
    import sys

    sys.path.insert(0, __file__.rsplit("/", 1)[0].rsplit("/", 1)[0] + "/unit")
    import numpy as np
    from test_sharded_exchange import _applied, _payload

    from reference_loops import dense_exchange
    from torchspark.errors import WaitTimeout
    from torchspark.training.algorithms.sharing.sharded import sharded_exchange
    from torchspark.training.comm import TorchDistCommunicator

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
    comm = TorchDistCommunicator(
        store, rank, world, "gloo", "cpu", 3.0 if timeout_case else 60.0, shared_memory=shared_memory
    )
    report: dict[str, Any] = {"rank": rank}
    try:
        if timeout_case:
            if rank == 0:
                try:
                    comm.all_to_all_bytes([b"x"] * world)
                    report["error"] = None
                except WaitTimeout as e:
                    report["error"] = str(e)
                finally:
                    store.set("a2a-timeout-case-over", b"1")
            else:
                # never joins, but stays alive until rank 0 has given up after its 3 s timeout (a peer that died
                # would be a different failure); the store wait bounds it
                store.wait(["a2a-timeout-case-over"], datetime.timedelta(seconds=60))
            return
        # payload j -> rank j: variable lengths, empty ones included
        sent = [bytes([rank, j]) * (rank * j) for j in range(world)]
        report["received"] = comm.all_to_all_bytes(sent)
        # the sharded exchange over gloo against the plain one, for every message kind
        kinds = ["sparse", "bitmap", "empty", "inactive"]
        report["same"], report["active"] = [], []
        for trial in range(8):
            rng = np.random.default_rng(trial * 10 + rank)
            kind = kinds[(trial + rank) % 4]
            payload = _payload(kind, 1001, rng)
            plain = dense_exchange(comm, payload, 1001, "cpu")
            sharded = sharded_exchange(comm, payload, 1001, "cpu")
            report["active"].append((plain.active, sharded.active))
            report["same"].append(None if plain.total is None else _applied(plain, 1001) == _applied(sharded, 1001))
            report.setdefault("digests", []).append(None if sharded.total is None else _applied(sharded, 1001))
    finally:
        out.put(report)
        comm.close()
