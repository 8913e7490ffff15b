"""Time to a target test accuracy under one Spark Connect session: torchspark ``fit(DataFrame)`` (both masters) vs
``pyspark.ml.torch.distributor.TorchDistributor`` + DDP.

Run: ``.venv/bin/python benchmarks/bench_connect_accuracy.py [--quick] [--target 0.9] [--methods avg5,sharing,ddp]``

One child process starts a Spark Connect server on ``local[2]`` (``start_connect_server``) and is its only client;
every method runs on that same session, one after the other. Data: the "MNIST-like" digits of
``bench_cluster.py`` (scikit-learn's digits upscaled to 20x20 at a random offset in 28x28, plus noise; generated,
no download), ``--n`` training examples as a DataFrame (``features array<float>`` of 784 values, ``label long``)
created from the client's Arrow table, cached and counted on the server before any clock starts; the test set is
the 360 test digits. The same network (MLP 784-256-10, Adam lr 1e-3), 2 workers x 32 examples per step:

- ``avg5``: ``ParameterAveragingTrainingMaster(averaging_frequency=5)``; ``sharing``: ``SharedTrainingMaster()``
  (defaults); both ``rng_seed=0``. First the accuracy curve (one ``fit(df, epochs=1)`` per epoch, test accuracy on
  the client after each) gives the epochs E to the target; then a fresh network trained with one
  ``fit(df, epochs=E)``, timed from the call to its return: the time to target.
- ``ddp``: what a careful TorchDistributor user writes under Connect. The client cannot hand the executors a
  DataFrame's rows, so the DataFrame is first written as parquet (``df.write.parquet``, timed: ``export_s``); then
  one ``TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(fn)`` where each rank reads its
  files (rank r: files r, r+2, ...) with pyarrow into tensors, and trains ``DistributedDataParallel`` over gloo
  with fused ``torch.optim.Adam`` and ``gradient_as_bucket_view=True``. Rank 0 evaluates after every epoch (the
  clock is paused then); time to target = export + launch (call to the function's start) + setup (process group,
  reading the files, DDP) + training up to the first epoch at the target.

Writes ``benchmarks/results/connect_accuracy.json`` and prints a table; BENCHMARKS.md "Spark Connect" holds the
numbers of a run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_cluster import mnist_like  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LR = 1e-3
HIDDEN = [256]
BATCH = 32
SEED = 0
METHODS = ("avg5", "sharing", "ddp")


def _frame(spark: Any, n: int) -> Any:
    import pyarrow as pa

    train = mnist_like("train", n, SEED)
    features = pa.FixedSizeListArray.from_arrays(pa.array(train.features.numpy().reshape(-1)), 784)
    table = pa.table(
        {"features": features.cast(pa.list_(pa.float32())), "label": pa.array(train.labels.numpy().astype("int64"))}
    )
    df = spark.createDataFrame(table.to_pandas()).repartition(2).cache()
    df.count()
    return df


def _network() -> Any:
    from torchspark import Network, models, optim

    return Network(models.mlp(784, HIDDEN, 10), loss="cross_entropy", updater=optim.Adam(lr=LR), seed=SEED)


def _master(method: str) -> Any:
    from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster

    common = dict(batch_size_per_worker=BATCH, num_workers=2, rng_seed=SEED)
    if method == "sharing":
        return SharedTrainingMaster(**common)
    return ParameterAveragingTrainingMaster(averaging_frequency=5, **common)


def run_torchspark(spark: Any, df: Any, method: str, test: Any, target: float, max_epochs: int) -> dict[str, Any]:
    """The accuracy curve, then one timed fit of the epochs it took."""
    from torchspark.spark import SparkNetwork

    out: dict[str, Any] = {"method": method, "curve": [], "reached": False}
    net = _network()
    with SparkNetwork(spark, net, _master(method), progress=False) as snet:
        for epoch in range(1, max_epochs + 1):
            t0 = time.perf_counter()
            snet.fit(df, epochs=1)
            fit_s = time.perf_counter() - t0
            acc = float(net.evaluate(test).accuracy())
            out["curve"].append({"epoch": epoch, "fit_s": fit_s, "accuracy": acc})
            print(f"{method}: epoch {epoch} fit {fit_s:.1f}s acc {acc:.4f}", file=sys.stderr, flush=True)
            if acc >= target:
                out["reached"], out["epochs_to_target"] = True, epoch
                break
    if not out["reached"]:
        return out
    net = _network()
    with SparkNetwork(spark, net, _master(method), progress=False) as snet:
        t0 = time.perf_counter()
        snet.fit(df, epochs=out["epochs_to_target"])
        out["time_to_target_s"] = time.perf_counter() - t0
    out["target_run_accuracy"] = float(net.evaluate(test).accuracy())
    return out


def _ddp_train(
    directory: str, test_x: Any, test_y: Any, target: float, max_epochs: int, lr: float, seed: int, hidden: list[int]
) -> Any:
    """The TorchDistributor training function (runs under torchrun in the barrier tasks; pickled by value)."""
    import glob as _glob
    import time as _time

    import numpy as _np
    import pyarrow.parquet as pq
    import torch as _torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from torchspark import models as _models

    start_wall = _time.time()
    t0 = _time.perf_counter()
    _torch.set_num_threads(1)
    _torch.set_flush_denormal(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    files = sorted(_glob.glob(os.path.join(directory, "*.parquet")))[rank::world]
    table = pq.read_table(files) if files else None
    x = _torch.from_numpy(_np.stack(table.column("features").to_numpy(zero_copy_only=False)).astype(_np.float32))
    y = _torch.from_numpy(table.column("label").to_numpy().astype(_np.int64))
    _torch.manual_seed(seed)
    module = _models.mlp(784, hidden, 10)
    ddp = DistributedDataParallel(module, gradient_as_bucket_view=True)
    opt = _torch.optim.Adam(ddp.parameters(), lr=lr, fused=True)
    dist.barrier()
    setup_s = _time.perf_counter() - t0
    steps = _torch.tensor([len(x) // 32])
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)  # equal step counts: DDP needs every rank in every step
    train_s, epochs = 0.0, []
    g = _torch.Generator().manual_seed(seed + rank)
    for epoch in range(1, max_epochs + 1):
        module.train()
        te = _time.perf_counter()
        order = _torch.randperm(len(x), generator=g)
        for s in range(int(steps[0])):
            idx = order[s * 32 : (s + 1) * 32]
            opt.zero_grad(set_to_none=True)
            _torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx]).backward()
            opt.step()
        dist.barrier()
        train_s += _time.perf_counter() - te
        acc = 0.0
        if rank == 0:
            module.eval()
            with _torch.no_grad():
                acc = float((module(test_x).argmax(1) == test_y).float().mean())
        stop = _torch.tensor([1 if acc >= target else 0])
        dist.broadcast(stop, 0)
        epochs.append({"epoch": epoch, "train_s": train_s, "accuracy": acc})
        if int(stop[0]):
            break
    dist.destroy_process_group()
    return {"rank": rank, "start_wall": start_wall, "setup_s": setup_s, "epochs": epochs}


def run_ddp(spark: Any, df: Any, test: Any, target: float, max_epochs: int, log_path: str) -> dict[str, Any]:
    """Export the DataFrame as parquet, then one TorchDistributor run."""
    from pyspark.ml.torch.distributor import TorchDistributor

    directory = tempfile.mkdtemp(prefix="bench-connect-ddp-")
    try:
        t0 = time.time()
        df.write.mode("overwrite").parquet(directory)
        export_s = time.time() - t0
        distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
        t_call = time.time()
        with open(log_path, "w") as ranks_log, contextlib.redirect_stdout(ranks_log):
            res = distributor.run(
                _ddp_train,
                directory,
                test.features.reshape(len(test), -1),
                test.labels,
                target,
                max_epochs,
                LR,
                SEED,
                HIDDEN,
            )
        run_wall_s = time.time() - t_call
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    launch_s = res["start_wall"] - t_call
    out: dict[str, Any] = {
        "method": "ddp",
        "reached": False,
        "export_s": export_s,
        "launch_s": launch_s,
        "setup_s": res["setup_s"],
        "run_wall_s": run_wall_s,
        "curve": [{"epoch": e["epoch"], "accuracy": e["accuracy"], "train_s": e["train_s"]} for e in res["epochs"]],
    }
    for e in res["epochs"]:
        if e["accuracy"] >= target:
            out.update(
                reached=True,
                epochs_to_target=e["epoch"],
                target_run_accuracy=e["accuracy"],
                time_to_target_s=export_s + launch_s + res["setup_s"] + e["train_s"],
            )
            break
    return out


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Every method on one Connect session (this process is its client)."""
    from torchspark.spark.connect import start_connect_server

    server = start_connect_server("local[2]")
    spark = server.session()
    try:
        df = _frame(spark, args.n)
        test = mnist_like("test", None, SEED + 1)
        results = []
        for method in args.methods.split(","):
            if method == "ddp":
                results.append(
                    run_ddp(
                        spark,
                        df,
                        test,
                        args.target,
                        args.max_epochs,
                        os.path.join(tempfile.gettempdir(), "bench_connect_accuracy.ranks.log"),
                    )
                )
            else:
                results.append(run_torchspark(spark, df, method, test, args.target, args.max_epochs))
            print(f"{method}: {json.dumps(results[-1])}", file=sys.stderr, flush=True)
        return {"n_train": args.n, "n_test": len(test), "target": args.target, "results": results}
    finally:
        spark.stop()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,048 examples, target 0.8")
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--max-epochs", type=int, default=20)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.n, args.target = 2048, 0.8
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    argv = [
        sys.executable,
        __file__,
        "--child",
        "--n",
        str(args.n),
        "--target",
        str(args.target),
        "--max-epochs",
        str(args.max_epochs),
        "--methods",
        args.methods,
    ]
    load_before = os.getloadavg()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"the benchmark failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}")
    result = json.loads(line[len("RESULT ") :])
    result.update(
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
    ddp = next((r for r in result["results"] if r["method"] == "ddp"), None)
    for r in result["results"]:
        ttt = r.get("time_to_target_s")
        ratio = (ddp["time_to_target_s"] / ttt) if ddp and ddp.get("reached") and ttt else None
        r["ddp_over_this"] = ratio
        print(
            f"{r['method']:8s} reached={r['reached']} epochs={r.get('epochs_to_target')} "
            f"time_to_target={ttt if ttt is None else round(ttt, 2)} s  "
            f"accuracy={r.get('target_run_accuracy')}  TorchDistributor/this={ratio}"
        )
    path = ROOT / "benchmarks" / "results" / "connect_accuracy.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
