"""Accuracy per epoch of gradient sharing with and without one step of staleness (no timing, no cluster).

Why it exists: on the namespace cluster (``bench_straggler.py``) the synchronous loop had 0.18 test accuracy after
epoch 1 where every ``max_staleness`` run had about 0.5. This reproduces that comparison on one machine and
separates its causes:

- ``sync``: ``SharedTrainingMaster()`` (``overlap=True``, the default: every update is computed from parameters
  missing the previous step's messages, one step stale);
- ``sync-no-overlap``: the same synchronous loop with ``overlap=False`` (no staleness);
- ``k=0`` / ``k=1``: ``max_staleness`` (own message applied at once; peers' messages before the next step with k=0,
  up to one step late with k=1);
- ``dense`` / ``dense-delayed``: no encoding at all: the two workers' Adam steps (each worker its own Adam state, as
  in sharing) summed and applied to one shared set of parameters at once, or one step late (what ``overlap=True``
  does, without threshold encoding).

The torchspark rows run the real worker loop (``InProcessRunner``: one thread per worker, real torch), ONE fit of one
epoch per epoch as ``bench_straggler.py`` does, on the same network (bench_cluster's 784-2048-1024-10 MLP, Adam 1e-3)
and data (4,096 MNIST-like training examples, 2 workers x 32 per step, 64 steps per epoch). Reported per epoch:
test accuracy, and the mean and largest training loss of the epoch's steps (both workers). Accuracy does not
depend on the machine's load, so no lock or repetitions are needed; seeds vary the data and initialisation.

Run: ``.venv/bin/python benchmarks/bench_staleness_accuracy.py [--seeds 0,1,2] [--epochs 2] [--configs ...]``
(about 1.5 minutes per seed on 2 cores). Results: ``benchmarks/results/staleness_accuracy.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import bench_cluster as B  # noqa: E402

CONFIGS = ("sync", "sync-no-overlap", "k=0", "k=1", "dense", "dense-delayed")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "staleness_accuracy.json")


def make_network(seed: int) -> Any:
    import torchspark as ts
    from torchspark import models, optim

    return ts.Network(models.mlp(784, B.HIDDEN, 10), loss="cross_entropy", updater=optim.Adam(lr=B.LR), seed=seed)


def make_master(config: str) -> Any:
    """The master of one of the torchspark configurations (every other setting the default)."""
    from torchspark.training.config.shared_master import SharedTrainingMaster

    options: dict[str, Any] = {
        "sync": {},
        "sync-no-overlap": {"overlap": False},
        "k=0": {"max_staleness": 0},
        "k=1": {"max_staleness": 1},
    }[config]
    return SharedTrainingMaster(batch_size_per_worker=B.BATCH_PER_WORKER, num_workers=2, **options)


def sharing_run(config: str, shards: list[list[Any]], test: Any, epochs: int, seed: int) -> list[dict[str, float]]:
    """The real loop, one fit per epoch; per epoch: accuracy, mean and max step loss."""
    import numpy as np

    from torchspark.nn import NetworkBlueprint
    from torchspark.stats import StatsCollector
    from torchspark.training import InProcessRunner, ItemSource, WorkerTask, merge_results
    from torchspark.training.hooks import WorkerHooks

    master = make_master(config)
    net = make_network(seed)
    out = []
    for epoch in range(epochs):
        # as SparkNetwork's driver builds it (rng_seed=B.SEED: every epoch after the first in a new order)
        task = WorkerTask(
            mode=master.mode,
            settings=master.algorithm_settings(),
            blueprint=NetworkBlueprint.of(net).to_bytes(),
            epochs=1,
            prefetch=0,
            num_threads=1,
            collect_stats=True,
            first_epoch=epoch,
            shuffle_seed=B.SEED,
        )
        runner = InProcessRunner(600.0, hooks_factory=lambda rank: WorkerHooks(recorder=StatsCollector(f"w{rank}")))
        results = runner.run(task, [ItemSource(s) for s in shards])
        merge_results(net, results)
        net.epoch += 1
        losses = np.concatenate([r.stats["scores"]["score"] for r in results])
        out.append(
            {
                "accuracy": float(net.evaluate(test).accuracy()),
                "mean_loss": float(losses.mean()),
                "max_loss": float(losses.max()),
                "start_threshold": net.extra_config.get("sharing.start_threshold"),
                "end_threshold": net.extra_config.get("sharing.threshold"),
            }
        )
    return out


def dense_run(
    delayed: bool, shards: list[list[Any]], test: Any, epochs: int, seed: int
) -> tuple[list[dict[str, float]], Any]:
    """No encoding: each worker's Adam step on its own minibatch, the sum applied to the shared parameters at once
    or one step late (the synchronous loop's overlap); the Adam states averaged after every epoch (as a fit's end).
    Returns the per-epoch results and the trained network."""
    import torch

    net = make_network(seed)
    replicas = [net.copy() for _ in shards]
    out = []
    for _ in range(epochs):
        pending: torch.Tensor | None = None
        losses = []
        for t in range(max(len(s) for s in shards)):
            total = sum(r.compute_update(s[t]) for r, s in zip(replicas, shards))  # (num_params,)
            losses += [r.last_score for r in replicas]
            if delayed:
                total, pending = pending, total
            for r in replicas:
                if total is not None:
                    r.apply_update(total)
        for r in replicas:
            if pending is not None:
                r.apply_update(pending)
        state = sum(r.updater_state() for r in replicas) / len(replicas)
        for r in replicas:
            r.set_updater_state(state)
        out.append(
            {
                "accuracy": float(replicas[0].evaluate(test).accuracy()),
                "mean_loss": sum(losses) / len(losses),
                "max_loss": max(losses),
            }
        )
    return out, replicas[0]


def main(argv: list[str] | None = None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="data and network seeds")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--n-train", type=int, default=4096)
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"subset of {', '.join(CONFIGS)}")
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad or args.epochs < 1:
        p.error(f"unknown configs {bad} (choose from {list(CONFIGS)}) or --epochs < 1")
    torch.set_num_threads(1)
    doc: dict[str, Any] = {
        "args": vars(args),
        "machine": C.machine_info(),
        "load_start": C.load_average(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "runs": [],
    }
    test = B.mnist_like("test", None, B.SEED + 1)
    for seed in (int(s) for s in args.seeds.split(",")):
        batches = B.mnist_like("train", args.n_train, seed).split(B.BATCH_PER_WORKER)
        shards = [batches[0::2], batches[1::2]]
        for config in configs:
            t0 = time.perf_counter()
            epochs = (
                dense_run(config == "dense-delayed", shards, test, args.epochs, seed)[0]
                if config.startswith("dense")
                else sharing_run(config, shards, test, args.epochs, seed)
            )
            doc["runs"].append({"seed": seed, "config": config, "epochs": epochs})
            C.log(
                f"seed {seed} {config}: accuracy {[round(e['accuracy'], 3) for e in epochs]}, max step loss "
                f"{[round(e['max_loss'], 2) for e in epochs]} ({time.perf_counter() - t0:.0f} s)"
            )
    doc["load_end"] = C.load_average()
    headers = ["config"] + [f"acc epoch {e + 1} (per seed)" for e in range(args.epochs)] + ["max step loss, epoch 1"]
    rows = []
    for config in configs:
        runs = [r for r in doc["runs"] if r["config"] == config]
        rows.append(
            [config]
            + [" / ".join(f"{r['epochs'][e]['accuracy']:.2f}" for r in runs) for e in range(args.epochs)]
            + [" / ".join(f"{r['epochs'][0]['max_loss']:.2f}" for r in runs)]
        )
    print(C.markdown_table(headers, rows))
    if not args.no_write:
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
