"""Accuracy and bytes of torchspark.ddp's threshold hook against all-reduce DDP: the setting of
tests/multiprocess/test_ddp_hook.py (MLP 64-64-10 on digits, 2 gloo ranks, batch 32 per rank), one row per variant.

Usage: python benchmarks/bench_ddp_hook.py [--epochs 4] [--variants allreduce:adam,hook:adam,...]

A variant is ``exchange:optimizer``; exchange is ``allreduce`` or ``hook`` (optionally ``hook+key=value+...``,
keys: target=, band=LOW~HIGH, initial=, noclip, smooth=BETA (an EMA of the decoded gradient),
dgc=1 (Deep Gradient Compression's momentum correction, with plain SGD); the rest go to ThresholdHookState), optimizer ``adam`` (lr 3e-3), ``sgd`` (lr 0.1) or ``sgdm`` (lr 0.1, momentum 0.9),
optionally ``@lr``. Prints test accuracy after every epoch and the bytes ratio (all-reduce bytes / hook bytes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "multiprocess"))

from _ranks import run_ranks  # noqa: E402

from torchspark import datasets  # noqa: E402
from torchspark.ddp import ThresholdHookState, threshold_hook  # noqa: E402
from torchspark.encoding import AdaptiveThreshold, NoResidualPostProcessing, TargetSparsityThreshold  # noqa: E402

BATCH = 32


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def _option(key: str, value: str) -> Any:
    if key == "target":
        return "threshold_algorithm", TargetSparsityThreshold(target=float(value))
    if key == "band":
        low, high = (float(v) for v in value.split("~"))
        return "threshold_algorithm", AdaptiveThreshold(min_target_sparsity=low, max_target_sparsity=high)
    if key == "initial":
        return "threshold_algorithm", AdaptiveThreshold(initial=float(value))
    if key == "noclip":
        return "residual_post_processor", NoResidualPostProcessing()
    return key, float(value) if "." in value or "e" in value else int(value)


class SmoothedState(ThresholdHookState):
    """Experiment: the decoded gradient smoothed by an EMA (identical on every rank)."""

    beta = 0.9

    def share(self, index, flat, params):  # type: ignore[no-untyped-def]
        decoded = super().share(index, flat, params).clone()
        ema = self.__dict__.setdefault("_ema", {})
        if index not in ema:
            ema[index] = torch.zeros_like(decoded)
        ema[index].mul_(self.beta).add_(decoded, alpha=1 - self.beta)
        flat.copy_(ema[index])
        return flat


class MomentumCorrectedState(ThresholdHookState):
    """Experiment: Deep Gradient Compression's momentum correction and factor masking (use with plain SGD): the
    velocity ``u = m*u + g`` is accumulated locally and fed to the residual; entries sent reset their velocity."""

    momentum = 0.9

    def share(self, index, flat, params):  # type: ignore[no-untyped-def]
        velocity = self.__dict__.setdefault("_velocity", {})
        if index not in velocity:
            velocity[index] = torch.zeros(flat.numel())
        u = velocity[index]
        u.mul_(self.momentum).add_(flat.reshape(-1))
        before = self._bucket_residual(index, params, flat.numel())[0].clone()
        flat.copy_(u.reshape(flat.shape))
        super().share(index, flat, params)
        after = self._bucket_residual(index, params, flat.numel())[0]
        sent = (before + u / self.world_size - after).abs() > 1e-12
        u[sent] = 0
        return flat


def optimizer_for(name: str, params: Any) -> torch.optim.Optimizer:
    name, _, lr = name.partition("@")
    if name == "adam":
        return torch.optim.Adam(params, lr=float(lr or 3e-3))
    if name == "sgd":
        return torch.optim.SGD(params, lr=float(lr or 0.1))
    if name == "sgdm":
        return torch.optim.SGD(params, lr=float(lr or 0.1), momentum=0.9)
    raise ValueError(name)


def one(variant: str, rank: int, world: int, epochs: int) -> dict[str, Any]:
    exchange, _, opt_name = variant.partition(":")
    model = mlp()
    ddp = DDP(model)
    state = None
    if exchange.startswith("hook"):
        options = dict(_option(*kv.split("=")) if "=" in kv else _option(kv, "") for kv in exchange.split("+")[1:])
        beta = options.pop("smooth", None)
        if beta is not None:
            SmoothedState.beta = beta
        cls: type[ThresholdHookState] = ThresholdHookState
        if options.pop("dgc", None):
            cls = MomentumCorrectedState
        elif beta is not None:
            cls = SmoothedState
        state = cls(model, **options)
        ddp.register_comm_hook(state, threshold_hook)
    data, test = datasets.digits("train"), datasets.digits("test")
    x, y = data.features[rank::world], data.labels[rank::world]
    optimizer = optimizer_for(opt_name, model.parameters())
    g = torch.Generator().manual_seed(1)
    accs = []
    for _ in range(epochs):
        order = torch.randperm(x.shape[0], generator=g)
        for i in range(0, x.shape[0] - BATCH + 1, BATCH):
            idx = order[i : i + BATCH]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx]).backward()
            optimizer.step()
        with torch.no_grad():
            accs.append(round(float((model(test.features).argmax(1) == test.labels).float().mean()), 4))
    ratio = state.compression if state is not None else 1.0
    return {"variant": variant, "accuracy": accs, "ratio": round(ratio, 1)}


def run(rank: int, world: int, port: int, variants: list[str], epochs: int, queue: Any) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    rows = []
    for v in variants:
        try:
            rows.append(one(v, rank, world, epochs))
        except Exception as e:  # noqa: BLE001 - a bad variant is reported, the rest run
            rows.append({"variant": v, "error": repr(e)})
    dist.destroy_process_group()
    queue.put({"rank": rank, "rows": rows})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--variants", default="allreduce:adam,hook:adam")
    args = parser.parse_args()
    reports = run_ranks(run, 2, args.variants.split(","), args.epochs, timeout_s=1800.0)
    for row in reports[0]["rows"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
