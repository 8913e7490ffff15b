"""Rank body of test_ddp_hook.py (module level, so the worker processes can import it by name): one process group,
every scenario in turn, one report per rank."""

from __future__ import annotations

import datetime
import faulthandler
import hashlib
import os
import tempfile
import traceback
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.nn.parallel import DistributedDataParallel as DDP

from torchspark import datasets
from torchspark.ddp import ThresholdGradients, ThresholdHookState, threshold_hook
from torchspark.errors import TorchSparkError

BATCH = 32


def mlp(hidden: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    )


def lenet() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 2 * 2, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 10),
    )


def checksums(model: torch.nn.Module) -> list[str]:
    """Every rank's SHA-256 of its parameters, gathered (the same list on every rank)."""
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, digest)
    return out


def train(
    model: torch.nn.Module, ddp: torch.nn.Module, rank: int, world: int, epochs: int, step=None, sgd_lr=None
) -> list[float]:
    """Train ``epochs`` epochs (Adam at 3e-3, or plain SGD at ``sgd_lr``); the test accuracy after each."""
    data = datasets.digits("train")
    shard = slice(rank, None, world)
    x, y = data.features[shard], data.labels[shard]
    if sgd_lr is None:
        optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=sgd_lr)
    g = torch.Generator().manual_seed(1)
    accuracies = []
    for _ in range(epochs):
        order = torch.randperm(x.shape[0], generator=g)
        for i in range(0, x.shape[0] - BATCH + 1, BATCH):
            idx = order[i : i + BATCH]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx]).backward()
            if step is not None:
                step()
            optimizer.step()
        accuracies.append(accuracy(model))
    return accuracies


def accuracy(model: torch.nn.Module) -> float:
    test = datasets.digits("test")
    with torch.no_grad():
        return float((model(test.features).argmax(1) == test.labels).float().mean())


def run(rank: int, world: int, port: int, epochs: int, sgd_epochs: int, queue: Any) -> None:
    report: dict[str, Any] = {"rank": rank}
    faulthandler.dump_traceback_later(240)  # a rank still running then shows where it is (stderr)
    try:
        store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=30))
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30)
        )
        torch.set_num_threads(1)
        # (a, b, c) MLP with the hook vs plain all-reduce DDP, same data and seeds
        model = mlp()
        ddp = DDP(model)
        state = ThresholdHookState(model)
        ddp.register_comm_hook(state, threshold_hook)
        train(model, ddp, rank, world, epochs)
        report["mlp"] = {
            "checksums": checksums(model),
            "accuracy": accuracy(model),
            "bytes_sent": state.bytes_sent,
            "dense_bytes": state.dense_bytes,
            "iteration": state.iteration,
            "threshold": state.threshold(0),
        }
        plain = mlp()
        train(plain, DDP(plain), rank, world, epochs)
        report["allreduce_accuracy"] = accuracy(plain)
        # (c) plain SGD at lr 0.3, long enough to converge: the hook at its defaults against all-reduce
        sgd_model = mlp()
        sgd_ddp = DDP(sgd_model)
        sgd_state = ThresholdHookState(sgd_model)
        sgd_ddp.register_comm_hook(sgd_state, threshold_hook)
        sgd_plain = mlp()
        report["sgd"] = {
            "hook": train(sgd_model, sgd_ddp, rank, world, sgd_epochs, sgd_lr=0.3),
            "allreduce": train(sgd_plain, DDP(sgd_plain), rank, world, sgd_epochs, sgd_lr=0.3),
            "compression": sgd_state.compression,
            "checksums": checksums(sgd_model),
        }
        # (a) LeNet-like CNN
        cnn = lenet()
        cnn_ddp = DDP(cnn)
        cnn_state = ThresholdHookState(cnn)
        cnn_ddp.register_comm_hook(cnn_state, threshold_hook)
        train(cnn, cnn_ddp, rank, world, 1)
        report["cnn"] = {"checksums": checksums(cnn), "iteration": cnn_state.iteration, "bytes": cnn_state.bytes_sent}
        # (d) state_dict round trip through safetensors
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hook.safetensors")
            save_file(state.state_dict(), path)
            restored = ThresholdHookState(mlp())
            restored.load_state_dict(load_file(path))
        report["state"] = {
            "residual_equal": torch.equal(restored.residual, state.residual),
            "residual_nonzero": bool(state.residual.abs().sum() > 0),
            "thresholds": [restored.threshold(0), state.threshold(0)],
            "counters": [restored.iteration, restored.bytes_sent, state.iteration, state.bytes_sent],
        }
        # the wrapper for loops without DDP
        plain_model = mlp()
        if rank == 1:
            with torch.no_grad():
                for p in plain_model.parameters():
                    p.add_(1.0)  # different starting points: the wrapper broadcasts rank 0's
        sharing = ThresholdGradients(plain_model)
        train(plain_model, plain_model, rank, world, 1, step=sharing.synchronize)
        moved = any(not torch.equal(a, b) for a, b in zip(plain_model.parameters(), mlp().parameters()))
        report["wrapper"] = {"checksums": checksums(plain_model), "moved": moved}
        # (e) ranks that disagree in shape
        try:
            ThresholdHookState(mlp(hidden=64 if rank == 0 else 65))
            report["mismatch"] = None
        except TorchSparkError as e:
            report["mismatch"] = f"{type(e).__name__}: {e}"
        dist.destroy_process_group()
    except BaseException:  # the test shows it
        report["error"] = traceback.format_exc()
    queue.put(report)
