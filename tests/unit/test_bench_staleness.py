"""The option parts of benchmarks/bench_straggler.py and benchmarks/bench_staleness_accuracy.py: every configuration
they name builds the master it claims, and the one-step-late dense reference loses no step."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))

import bench_cluster as B  # noqa: E402
import bench_staleness_accuracy as A  # noqa: E402
import bench_straggler as S  # noqa: E402


@pytest.mark.parametrize(
    ("k", "overlap", "max_staleness"),
    [("sync", True, None), ("sync-no-overlap", False, None), ("0", True, 0), ("4", True, 4)],
)
def test_straggler_ks_build_the_master_they_name(k: str, overlap: bool, max_staleness: int | None) -> None:
    master = S.make_master(k)
    assert (master.overlap, master.max_staleness) == (overlap, max_staleness)


def test_straggler_arguments_accept_sync_no_overlap_and_order_the_table() -> None:
    args = S.parse_args(["--ks", "4,sync-no-overlap,sync,0", "--slowdowns", "none"])
    assert args.ks == "4,sync-no-overlap,sync,0"
    assert sorted(args.ks.split(","), key=S._k_order) == ["sync", "sync-no-overlap", "0", "4"]
    with pytest.raises(SystemExit):
        S.parse_args(["--ks", "sync,overlap"])


@pytest.mark.parametrize(
    ("config", "overlap", "max_staleness"),
    [("sync", True, None), ("sync-no-overlap", False, None), ("k=0", True, 0), ("k=1", True, 1)],
)
def test_accuracy_configs_build_the_master_they_name(config: str, overlap: bool, max_staleness: int | None) -> None:
    master = A.make_master(config)
    assert (master.overlap, master.max_staleness) == (overlap, max_staleness)
    assert master.batch_size_per_worker == B.BATCH_PER_WORKER and master.num_workers == 2


def test_accuracy_arguments_refuse_an_unknown_config() -> None:
    with pytest.raises(SystemExit):
        A.main(["--configs", "sync,async", "--no-write"])


def test_dense_delayed_applies_every_step_one_step_late() -> None:
    """One minibatch per worker: the delayed run applies its only step at the epoch's end, so it ends where the
    immediate one does; with two minibatches the second is computed without the first applied, so they differ."""
    data = B.mnist_like("train", 4 * B.BATCH_PER_WORKER, seed=5).split(B.BATCH_PER_WORKER)
    test = B.mnist_like("test", None, seed=1)
    one = [[data[0]], [data[1]]]
    _, now = A.dense_run(False, one, test, 1, seed=0)
    _, late = A.dense_run(True, one, test, 1, seed=0)
    assert torch.equal(now.params(), late.params())
    two = [[data[0], data[2]], [data[1], data[3]]]
    _, now = A.dense_run(False, two, test, 1, seed=0)
    _, late = A.dense_run(True, two, test, 1, seed=0)
    assert not torch.equal(now.params(), late.params())
