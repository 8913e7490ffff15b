"""The rest of ParameterAveragingTrainingMaster's data options on a real local[2] session: repartition
``"num_partitions_workers_differs"``, ``repartition_strategy="spark_default"``, MultiDataSet RDDs and ``fit_paths``
from an RDD of paths."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from torch import nn

from helpers import mlp_net, parts_of_sizes
from torchspark import MultiDataSet, Network, datasets, optim, save_batches
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork

BATCH = 8


_parts = partial(parts_of_sizes, n_features=6, seed=9)
_net = partial(mlp_net, 6, 8, 3, updater=optim.SGD(lr=0.05))


def _fit(spark, data, **options) -> SparkNetwork:
    settings = {"batch_size_per_worker": BATCH, "averaging_frequency": 2, "num_workers": 2, **options}
    spark_net = SparkNetwork(spark, _net(), ParameterAveragingTrainingMaster(**settings), progress=False)
    spark_net.fit(data, epochs=1)
    spark_net.delete_temp_files()
    return spark_net


@pytest.mark.parametrize("approach", ["export", "direct"])
def test_num_partitions_workers_differs_keeps_matching_partitions_and_balances_the_rest(
    spark, sc, approach: str
) -> None:
    """Two partitions for two workers are kept as they are (40 and 8 examples: worker 0 trains 40); three
    partitions are balanced to 24 + 24."""
    kept = _fit(
        spark,
        sc.parallelize(_parts([40, 8]), 2),
        repartition="num_partitions_workers_differs",
        rdd_training_approach=approach,
    )
    assert [r.examples for r in kept.last_results] == [40, 8]
    assert kept.network.iteration == 5  # worker 0's 5 minibatches of 8 set the pace
    balanced = _fit(
        spark,
        sc.parallelize(_parts([40, 4, 4]), 3),
        repartition="num_partitions_workers_differs",
        rdd_training_approach=approach,
    )
    assert [r.examples for r in balanced.last_results] == [24, 24]


@pytest.mark.parametrize("approach", ["export", "direct"])
def test_spark_default_trains_every_example_once_per_epoch(spark, sc, approach: str) -> None:
    """``rdd.repartition`` of each partition's minibatches: shares are only roughly equal, but every example is
    trained exactly once and both workers train."""
    spark_net = _fit(
        spark,
        sc.parallelize(_parts([37, 5, 50, 4]), 4),
        repartition_strategy="spark_default",
        rdd_training_approach=approach,
    )
    examples = [r.examples for r in spark_net.last_results]
    assert sum(examples) == 96 and min(examples) > 0, examples
    assert np.isfinite(spark_net.score)


def test_multidataset_rdd_trains_a_two_input_two_output_network(spark, sc) -> None:
    class TwoHead(nn.Module):  # defined here: shipped to the executors by value
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 16)
            self.b = nn.Linear(2, 16)
            self.cls = nn.Linear(16, 2)
            self.reg = nn.Linear(16, 1)

        def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = torch.relu(self.a(x1) + self.b(x2))
            return self.cls(h), self.reg(h)

    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(256, 3, generator=g), torch.randn(256, 2, generator=g)
    data = MultiDataSet([x1, x2], [(x1[:, 0] > 0).long(), x2[:, :1] * 2.0])
    net = Network(TwoHead(), loss=["cross_entropy", "mse"], updater=optim.Adam(lr=1e-2), seed=0)
    before = net.score(data)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2, num_workers=2)
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(data.split(50), 3), epochs=6)  # re-batched from 50 to 16
    spark_net.delete_temp_files()
    assert sorted(r.examples for r in spark_net.last_results) == [128 * 6, 128 * 6]
    assert net.score(data) < 0.5 * before
    probs, reg = net.output([x1, x2])
    assert probs.shape == (256, 2) and reg.shape == (256, 1)
    assert (probs.argmax(1) == (x1[:, 0] > 0).long()).float().mean() > 0.9


def test_fit_paths_from_an_rdd_trains_like_the_list(spark, sc, tmp_path) -> None:
    """An RDD of batch-file paths is planned exactly like the same paths in a list (repartition="always"); with
    repartition="never" each worker trains its own partition's files."""
    data = datasets.synthetic_classification(120, 6, 3, seed=2)
    paths = save_batches(data.split(BATCH), str(tmp_path / "batches"))  # 15 files
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=BATCH, averaging_frequency=2, num_workers=2, rng_seed=1
    )
    params = []
    for source in (paths, sc.parallelize(paths, 3)):
        net = _net()
        SparkNetwork(spark, net, master, progress=False).fit_paths(source, epochs=2)
        params.append(net.params())
    torch.testing.assert_close(params[0], params[1], atol=0, rtol=0)
    assert not torch.equal(params[0], _net().params())

    never = ParameterAveragingTrainingMaster(batch_size_per_worker=BATCH, num_workers=2, repartition="never")
    spark_net = SparkNetwork(spark, _net(), never, progress=False)
    spark_net.fit_paths(sc.parallelize(paths[:12], 1).union(sc.parallelize(paths[12:], 1)))  # 12 files + 3 files
    assert [r.examples for r in spark_net.last_results] == [12 * BATCH, 3 * BATCH]


def test_spread_round_robin_deals_a_few_items_evenly(sc) -> None:
    """PySpark's ``repartition`` moves pickled batches of up to 10 items, so 13 items can all land on one
    partition; ``spread_round_robin`` deals them one by one (sizes differ by at most one per input partition)."""
    from torchspark.spark.data import spread_round_robin

    sizes = spread_round_robin(sc.parallelize(range(13), 1), 2).glom().map(len).collect()
    assert sizes == [7, 6]
    spread = spread_round_robin(sc.parallelize(range(13), 3), 2).glom().collect()
    assert sorted(x for part in spread for x in part) == list(range(13))
    assert max(map(len, spread)) - min(map(len, spread)) <= 3
    assert spread_round_robin(sc.parallelize(range(4), 4), 3).glom().map(len).collect() == [2, 1, 1]


def test_fit_paths_rebatches_files_like_the_export_route(spark, sc, tmp_path) -> None:
    """Files of any size train in minibatches of batch_size_per_worker (DL4J re-batches exported data): the same
    minibatches, hence the same parameters, as fitting an RDD of the same examples on the export route."""
    data = datasets.synthetic_classification(90, 6, 3, seed=4)
    cuts = [0, 5, 30, 32, 70, 90]  # files of 5, 25, 2, 38 and 20 examples
    pieces = [data.slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    paths = save_batches(pieces, str(tmp_path / "batches"))
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=BATCH, averaging_frequency=2, num_workers=2, rng_seed=3, collect_training_stats=True
    )
    from_files = _net()
    files_net = SparkNetwork(spark, from_files, master, progress=False)
    files_net.fit_paths(paths, epochs=2)
    from_rdd = _net()
    rdd_net = SparkNetwork(spark, from_rdd, master, progress=False)
    rdd_net.fit(sc.parallelize(pieces, 2), epochs=2)
    rdd_net.delete_temp_files()

    assert [r.examples for r in files_net.last_results] == [2 * 45, 2 * 45]
    assert [r.iterations for r in files_net.last_results] == [r.iterations for r in rdd_net.last_results]
    # 11 full minibatches, the 2-example remainder, and one full minibatch cut in two at the workers' split
    assert files_net.training_stats.summary()["minibatches"] == 2 * 13
    torch.testing.assert_close(from_files.params(), from_rdd.params())
