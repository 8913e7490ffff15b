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
