"""Shuffle between epochs on Spark: the export and direct routes train every epoch in a new seeded order (within
each worker with ``shuffle_scope="worker"``, across workers with ``"global"``), the very sequences ParallelWrapper
trains for the same seed."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
import torch
from torch import nn

from helpers import indexed_data
from torchspark import Network, optim
from torchspark.data import DataSet
from torchspark.parallel import ParallelWrapper
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork
from torchspark.training.driver.runner import InProcessRunner

N, BATCH, WORKERS, SEED = 46, 4, 2, 11
SEEN: dict[str, list[tuple[int, ...]]] = defaultdict(list)


class Recorder(nn.Module):
    """Records the example ids (feature 0) of every training minibatch, by worker thread (in-process runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            SEEN[threading.current_thread().name].append(tuple(int(v) for v in x[:, 0].tolist()))
        return self.lin(x * 0.01)


def _master(approach: str, scope: str = "global") -> ParameterAveragingTrainingMaster:
    return ParameterAveragingTrainingMaster(
        batch_size_per_worker=BATCH,
        averaging_frequency=2,
        num_workers=WORKERS,
        rng_seed=SEED,
        rdd_training_approach=approach,
        shuffle_scope=scope,
    )


@pytest.mark.parametrize("scope", ["worker", "global"])
@pytest.mark.parametrize("approach", ["export", "direct"])
def test_spark_routes_reshuffle_every_epoch_like_parallel_wrapper(spark, sc, approach: str, scope: str) -> None:
    SEEN.clear()
    spark_net = SparkNetwork(
        spark,
        Network(Recorder(), updater=optim.SGD(lr=0.1), seed=0),
        _master(approach, scope),
        progress=False,
        runner=InProcessRunner(),
    )
    spark_net.fit(sc.parallelize(indexed_data(N).split(7), 3), epochs=3)
    spark_net.delete_temp_files()
    on_spark = dict(SEEN)

    SEEN.clear()
    ParallelWrapper(
        Network(Recorder(), updater=optim.SGD(lr=0.1), seed=0),
        num_workers=WORKERS,
        rng_seed=SEED,
        averaging_frequency=2,
        progress=False,
        runner=InProcessRunner(),
        shuffle_scope=scope,
    ).fit(indexed_data(N), epochs=3, batch_size=BATCH)
    assert on_spark == dict(SEEN)
    worker0 = on_spark["torchspark-worker-0"]
    per_epoch = len(worker0) // 3
    assert worker0[:per_epoch] != worker0[per_epoch : 2 * per_epoch]  # a new order in the second epoch
    kept = sorted(worker0[:per_epoch]) == sorted(worker0[per_epoch : 2 * per_epoch]) == sorted(worker0[2 * per_epoch :])
    assert kept == (scope == "worker")  # the worker scope moves no minibatch between workers; global does
    assert sorted(i for seq in on_spark.values() for b in seq for i in b) == sorted(list(range(N)) * 3)


@pytest.mark.parametrize("scope", ["worker", "global"])
def test_direct_route_streams_its_epochs_through_the_barrier_stage(spark, sc, scope: str) -> None:
    """Real barrier tasks: the direct route's per-epoch minibatches (global: read epoch by epoch from the shuffle;
    worker: the persisted partition, reordered) train exactly what the export route's per-epoch paths do."""
    params = []
    for approach in ("export", "direct"):
        net = Network(
            nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3)), updater=optim.SGD(lr=0.05, momentum=0.9), seed=0
        )
        spark_net = SparkNetwork(spark, net, _master(approach, scope), progress=False)
        data = indexed_data(N)
        spark_net.fit(sc.parallelize(DataSet(data.features / N, data.labels).split(7), 3), epochs=2)
        spark_net.delete_temp_files()
        params.append(net.params())
        assert net.epoch == 2
    torch.testing.assert_close(params[0], params[1], atol=1e-6, rtol=1e-6)
