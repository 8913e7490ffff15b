"""Memory at scale: export and train on a synthetic dataset larger than the driver's memory.

The data is generated on the executors (never on the driver), exported with ``torchspark.spark.export_batches``,
and trained with ``SparkNetwork.fit_paths`` on ``local-cluster`` (separate executor JVMs, ``spark.driver.memory``
below the data size). A sampler thread reads ``/proc`` every 0.2 s and records the peak resident memory of the
driver (this Python process plus its JVM) and of every executor (its JVM plus its Python workers). In the same run
a plain ``df.write.parquet`` of the same examples (the same generator behind ``mapInArrow``) gives the baseline
for the export throughput.

Usage: ``python benchmarks/bench_memory.py --gb 3 --driver-memory 1g`` (``--gb`` of float32 features; results in
``benchmarks/results/memory.json`` and printed as a Markdown table).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FEATURES = 784  # MNIST-sized rows: 3136 bytes of float32 features each
ROWS_PER_ITEM = 2048


def _generate(rows_per_partition: int, index: int):
    """Partition ``index``'s examples, as DataSets of ROWS_PER_ITEM rows (the same numbers on every call)."""
    import torch

    from torchspark.data import DataSet

    rng = np.random.default_rng([11, index])
    left = rows_per_partition
    while left > 0:
        n = min(ROWS_PER_ITEM, left)
        labels = rng.integers(0, 10, n)
        x = rng.standard_normal((n, FEATURES), dtype=np.float32) * 0.5
        x[np.arange(n), labels] += 2.0  # learnable: the label's column stands out
        left -= n
        yield DataSet(torch.from_numpy(x), torch.from_numpy(labels))


def _as_arrow(rows_per_partition: int, batches):
    import pyarrow as pa

    for rb in batches:
        for index in rb.column(0).to_pylist():
            for ds in _generate(rows_per_partition, index):
                x = ds.features.numpy()
                offsets = pa.array(np.arange(0, x.size + 1, FEATURES, dtype=np.int32))
                values = pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)))
                yield pa.RecordBatch.from_arrays([values, pa.array(ds.labels.numpy())], names=["features", "label"])


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += _children(p)
    return seen


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class PeakSampler:
    """Peak RSS of the driver (this process + its JVM) and of each executor JVM with its Python workers."""

    def __init__(self) -> None:
        self.me = os.getpid()
        self.peak_driver_python = 0
        self.peak_driver_jvm = 0
        self.peak_executors: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak_driver_python = max(self.peak_driver_python, _rss_kb(self.me))
        for child in _children(self.me):
            if "java" not in _cmdline(child):
                continue
            self.peak_driver_jvm = max(self.peak_driver_jvm, _rss_kb(child))
            # local-cluster: the driver JVM starts a Worker JVM per executor, which starts the executor JVM
            for pid in _tree(child)[1:]:
                if "CoarseGrainedExecutorBackend" in _cmdline(pid):
                    total = sum(_rss_kb(p) for p in _tree(pid))
                    self.peak_executors[pid] = max(self.peak_executors.get(pid, 0), total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.2)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _dir_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=3.0, help="feature bytes to generate (float32)")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--executor-mb", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workdir", default=None, help="where the export and parquet go (default: a temp dir)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "memory.json"))
    args = parser.parse_args()

    from torchspark import Network, models, optim
    from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, export_batches, local_session

    rows = int(args.gb * 1e9 / (FEATURES * 4))
    per_part = -(-rows // args.partitions)
    rows = per_part * args.partitions
    data_mb = rows * (FEATURES * 4 + 8) / 1e6
    work = tempfile.mkdtemp(prefix="ts-memory-", dir=args.workdir)
    master = f"local-cluster[{args.executors},1,{args.executor_mb}]"
    spark = local_session(
        master=master, conf={"spark.driver.memory": args.driver_memory, "spark.executor.memory": f"{args.executor_mb}m"}
    )
    sc = spark.sparkContext
    result: dict = {
        "rows": rows,
        "features": FEATURES,
        "data_mb": round(data_mb, 1),
        "master": master,
        "driver_memory": args.driver_memory,
        "partitions": args.partitions,
        "batch": args.batch,
    }
    try:
        with PeakSampler() as sampler:
            rdd = sc.parallelize(range(args.partitions), args.partitions).mapPartitionsWithIndex(
                lambda i, _: _generate(per_part, i)
            )
            t0 = time.perf_counter()
            paths = export_batches(rdd, f"{work}/export", args.batch)
            export_s = time.perf_counter() - t0
            export_peak = dict(sampler.peak_executors), sampler.peak_driver_python, sampler.peak_driver_jvm

            df = spark.range(args.partitions, numPartitions=args.partitions).mapInArrow(
                lambda batches: _as_arrow(per_part, batches), "features array<float>, label long"
            )
            t0 = time.perf_counter()
            df.write.parquet(f"{work}/parquet")
            parquet_s = time.perf_counter() - t0

            net = Network(models.mlp(FEATURES, 64, 10), updater=optim.Adam(lr=1e-3), seed=0)
            tm = ParameterAveragingTrainingMaster(
                batch_size_per_worker=args.batch, averaging_frequency=5, num_workers=args.executors, rng_seed=0
            )
            spark_net = SparkNetwork(spark, net, tm, progress=False)
            t0 = time.perf_counter()
            spark_net.fit_paths(f"{work}/export", epochs=1)
            fit_s = time.perf_counter() - t0
        result.update(
            {
                "files": len(paths),
                "export_s": round(export_s, 1),
                "export_mb_s": round(data_mb / export_s, 1),
                "export_disk_mb": round(_dir_bytes(f"{work}/export") / 1e6, 1),
                "parquet_s": round(parquet_s, 1),
                "parquet_mb_s": round(data_mb / parquet_s, 1),
                "parquet_disk_mb": round(_dir_bytes(f"{work}/parquet") / 1e6, 1),
                "fit_s": round(fit_s, 1),
                "fit_examples": sum(r.examples for r in spark_net.last_results),
                "score": round(spark_net.score, 4),
                "peak_driver_python_mb": round(sampler.peak_driver_python / 1024, 1),
                "peak_driver_jvm_mb": round(sampler.peak_driver_jvm / 1024, 1),
                "peak_executor_mb": [round(v / 1024, 1) for v in sampler.peak_executors.values()],
                "peak_executor_mb_during_export": [round(v / 1024, 1) for v in export_peak[0].values()],
                "load_1min": os.getloadavg()[0],
            }
        )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
