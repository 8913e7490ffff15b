"""The real-size workloads of the benchmarks (benchmarks/_workloads.py): what bench_cluster's ``--workload
transformer`` writes and where both benchmarks put their sections (the runs themselves: the lead's quiet machine)."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))

import _workloads as W  # noqa: E402
import bench_cluster as B  # noqa: E402
import bench_throughput as T  # noqa: E402
from torchspark.data import load_batch  # noqa: E402


def test_transformer_workload_writes_token_batches_and_a_test_set_of_the_same_task(tmp_path) -> None:
    data = B.prepare_data(str(tmp_path), 64, "transformer")
    assert data["n_train"] == 64 and data["n_test"] == B.N_TEST_KEYWORDS
    batch = load_batch(data["train"][0])
    assert batch.features.shape == (B.BATCH_PER_WORKER, 64) and batch.features.dtype == torch.int64
    train, test = W.WORKLOADS["transformer"].split(64, 32)
    whole = W.WORKLOADS["transformer"].dataset(96)  # one call, sliced: the same task (the same keywords)
    assert torch.equal(torch.cat([train.features, test.features]), whole.features)


def test_sections_of_the_real_size_runs() -> None:
    assert B.section_name(B.parse_args(["--workload", "transformer"])) == "cluster_transformer"
    assert B.section_name(B.parse_args([])) == "cluster"
    args = type("Args", (), {"models": "vgg,transformer", "memory_format": "contiguous"})()
    assert T.section_name(args) == "throughput_real_size"
    args.models = "mlp,lenet"
    assert T.section_name(args) == "throughput"
    assert T.module_spec("transformer") == ("text_transformer", W.WORKLOADS["transformer"].kwargs)


def test_issue_29_targets_read_the_fused_loop_and_the_per_call_overhead() -> None:
    ratios = {("mlp", "plain_fused"): 1.2, ("mlp", "spark_avg"): 1.2, ("mlp", "spark_shared"): 0.6}
    ratios[("mlp", "independent")] = 1.44
    overheads = {("lenet", "spark_avg"): 0.39, ("lenet", "pw_avg"): 0.25}
    targets = {t["target"]: t for t in T.evaluate_targets(ratios, ["mlp", "lenet"], overheads)}
    avg = targets["MLP: SparkNetwork averaging >= 0.9x the fused plain loop (a2)"]
    assert avg["met"] is True and avg["measured"] == "1.00x (ceiling: 2 independent processes 1.20x)"
    assert targets["MLP: SparkNetwork sharing >= 0.8x the fused plain loop (a2)"]["met"] is False  # 0.5x
    assert targets["LeNet: per-call overhead <= 0.3 s warm (SparkNetwork averaging)"]["met"] is False
    pw = targets["LeNet: per-call overhead <= 0.3 s warm (ParallelWrapper averaging)"]
    assert pw["met"] is True and pw["measured"] == "0.25 s"
