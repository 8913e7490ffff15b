"""Training functions for ``torchspark.launch.run`` tests (local processes, classic Spark, Spark Connect).

Importable from every test folder (pytest puts ``tests/`` on ``sys.path``); the test modules register this module
with cloudpickle *by value*, so the executors and the rank processes need no ``tests/`` on their path.

``ddp_train`` is the function of TorchDistributor's documentation (init_process_group, a DDP-wrapped model, a few
steps, rank 0 returns something), unmodified apart from its data: each rank's minibatches are drawn from a
generator seeded by (rank, step), so two runs of it train the same model.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torchspark.launch import get_checkpoint, get_context, report

FEATURES = 4


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, FEATURES, generator=g)
    return x, x.sum(1, keepdim=True)


def ddp_train(learning_rate: float, use_gpu: bool, steps: int = 5) -> dict:
    """TorchDistributor's documented DDP function (its data made deterministic)."""
    backend = "nccl" if use_gpu else "gloo"
    dist.init_process_group(backend)
    device = int(os.environ["LOCAL_RANK"]) if use_gpu else "cpu"
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(FEATURES, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    rank = dist.get_rank()
    for step in range(steps):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
    return {
        "world": int(os.environ["WORLD_SIZE"]),
        "master": (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])),
        "state": {k: v.cpu() for k, v in model.module.state_dict().items()},
    }


def resumable_train(steps: int, marker: str | None = None, kill_at: int = 3, lr: float = 0.05) -> dict:
    """A DDP loop that reports a checkpoint (a state dict) after every step and restarts from ``get_checkpoint()``.

    With ``marker``: on the first attempt (the marker file does not exist yet) rank 1 creates it and ends its
    process with ``os._exit`` right after step ``kill_at``'s checkpoint, as a lost executor would.
    """
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    start = 0
    restored = get_checkpoint()
    if restored is not None:
        start = int(restored.pop("next_step").item())
        model.load_state_dict(restored)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
    for step in range(start, steps):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        state["next_step"] = torch.tensor(step + 1)
        report({"loss": loss.item(), "epoch": 0}, checkpoint=state)
        if marker is not None and rank == 1 and step + 1 == kill_at and not os.path.exists(marker):
            dist.barrier()  # rank 0's checkpoint of this step is complete before the loss
            open(marker, "w").close()
            os._exit(17)
        dist.barrier()
    dist.destroy_process_group()
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "start": start,
        "attempt": get_context().attempt,
    }


def failing_train(log_path: str) -> None:
    """Every rank notes its attempt in ``log_path``; rank 1 raises the user's error."""
    ctx = get_context()
    with open(log_path, "a") as f:
        f.write(f"{ctx.attempt} {ctx.rank}\n")
    if ctx.rank == 1:
        raise ValueError("bad learning rate in the user's code")
    time.sleep(1.0)


def bad_checkpoint_train() -> None:
    """Reports a checkpoint that is neither a state dict nor a directory."""
    report({"loss": 1.0}, checkpoint=[1, 2, 3])


def directory_checkpoint_train(directory_name: str) -> dict:
    """Rank 0 writes files into a directory and reports it; then reads the newest checkpoint back."""
    ctx = get_context()
    if ctx.rank == 0:
        os.makedirs(directory_name, exist_ok=True)
        with open(os.path.join(directory_name, "weights.bin"), "wb") as f:
            f.write(b"\x00\x01weights")
        os.makedirs(os.path.join(directory_name, "sub"), exist_ok=True)
        with open(os.path.join(directory_name, "sub", "empty.txt"), "wb") as f:
            pass
        report({"loss": 0.5}, checkpoint=directory_name)
        back = get_checkpoint()
        return {
            "weights": open(os.path.join(back, "weights.bin"), "rb").read(),
            "empty": os.path.getsize(os.path.join(back, "sub", "empty.txt")),
        }
    return {}


def data_train(epochs: int = 2, batch_size: int = 4) -> dict:
    """Each rank reads its share of ``run(data=...)`` for ``epochs`` epochs; rank 0 returns every rank's ids (all
    gathered), the per-epoch orders of rank 0, and the column dtypes."""
    dist.init_process_group("gloo")
    ctx = get_context()
    orders = []
    mine: list[int] = []
    dtypes = {}
    for epoch in range(epochs):
        ids: list[int] = []
        for batch in ctx.data(epoch=epoch, batch_size=batch_size):
            ids += batch["id"].tolist()
            dtypes = {k: str(v.dtype) for k, v in batch.items()}
            assert batch["x"].shape[1] == 2
        orders.append(ids)
        if epoch == 0:
            mine = ids
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sorted(mine))
    dist.destroy_process_group()
    return {"ids": everyone, "orders": orders, "dtypes": dtypes}


def hanging_train(stall_marker: str) -> None:
    """Reports once, then rank 1 hangs (a deadlock in the user's code) while rank 0 waits for it."""
    dist.init_process_group("gloo")
    report({"loss": 1.0})
    if dist.get_rank() == 1:
        open(stall_marker, "w").close()
        time.sleep(3600)
    dist.barrier()
    dist.destroy_process_group()


def big_result(megabytes: int) -> bytes:
    """Rank 0 returns ``megabytes`` MiB (more than one part of the result channel)."""
    return bytes(range(256)) * (megabytes * 4096) if get_context().rank == 0 else b""
