"""Worker body of test_mailbox_gloo.py (module level, so spawned processes can import it by name)."""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch
import torch.distributed as dist

from torchspark.training.comm.mailbox import END, MESSAGE, Envelope, TorchDistMailbox

#: messages per epoch of rank r: BASE + 10 * r (unequal counts); payload of message i: (i % 7) * CHUNK bytes
BASE = 120
CHUNK = 40_000


def payload(rank: int, i: int) -> bytes:
    return bytes([rank + 1]) * ((i % 7) * CHUNK)


def run(rank: int, world: int, port: int, epochs: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        for epoch in range(epochs):
            box = TorchDistMailbox(rank, world, epoch)
            count = BASE + 10 * rank
            for i in range(count):
                box.post(Envelope(i, epoch, MESSAGE, payload(rank, i)))
                if rank == 1:
                    time.sleep(0.001)  # a slower sender
            box.post(Envelope(count, epoch, END))
            got: dict[int, list] = {p: [] for p in range(world) if p != rank}
            open_ = set(got)
            while open_:
                item = box.receive(open_, 60.0)
                assert item is not None, f"rank {rank}: nothing from {open_}"
                sender, env = item
                got[sender].append(env)
                if env.flags == END:
                    open_.discard(sender)
            box.close()
            for p, envs in got.items():
                assert [e.seq for e in envs] == list(range(BASE + 10 * p + 1)), (rank, p)
                assert all(e.epoch == epoch for e in envs)
                assert all(e.payload == payload(p, e.seq) for e in envs[:-1]), (rank, p)
            total = torch.ones(1)
            dist.all_reduce(total)  # the group is free for collectives between epochs
            assert total.item() == world
    finally:
        dist.destroy_process_group()


def run_failing(rank: int, world: int, port: int, out: Any) -> None:
    """Rank 1 fails after 3 messages (``close(failed=True)``); its peers learn it from its ABORT marker through the
    ledger (PeerLost), fail in turn, and every receiver thread of every rank ends before the group is destroyed."""
    import threading

    from torchspark.errors import PeerLost
    from torchspark.training.algorithms.sharing.ledger import PeerLedger
    from torchspark.training.waiting import Deadline

    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    report: dict[str, Any] = {"rank": rank}
    try:
        box = TorchDistMailbox(rank, world, 0)
        for i in range(3):
            box.post(Envelope(i, 0, MESSAGE, payload(rank, i)))
        if rank != 1:
            ledger = PeerLedger([p for p in range(world) if p != rank], epoch=0)
            try:
                while True:
                    item = box.receive(set(ledger.received) - set(ledger.ended), 60.0)
                    assert item is not None, f"rank {rank}: no ABORT from rank 1 within 60 s"
                    ledger.accept(*item)
            except PeerLost as e:
                report["error"] = str(e)
        box.close(failed=True)
        deadline = Deadline.after(60.0)  # every rank sends ABORT; every receiver thread ends well within this
        for t in [t for t in threading.enumerate() if t.name.startswith("torchspark-mailbox-recv")]:
            t.join(deadline.left())
        report["receivers_alive"] = [
            t.name for t in threading.enumerate() if t.name.startswith("torchspark-mailbox-recv") and t.is_alive()
        ]
    finally:
        out.put(report)
        dist.destroy_process_group()
