"""On a real local[2] session: gradient sharing never diverges silently (``on_divergence`` honoured both
ways), ``drop_last`` trains only full minibatches on both data routes, and the balanced split gives no worker a
1-example minibatch that BatchNorm would fail on."""

from __future__ import annotations

import warnings
from functools import partial

import pytest
import torch

from helpers import mlp_net
from torchspark import Network, datasets, models, optim
from torchspark.errors import TrainingError
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

_diverging = partial(mlp_net, 64, 16, 10, updater=optim.SGD(lr=1e12))


@pytest.fixture(scope="module")
def digits_rdd(sc):
    return sc.parallelize(datasets.digits("train").slice(0, 320).split(40), 4)


def test_diverging_gradient_sharing_fails_with_the_averaging_advice(spark, digits_rdd) -> None:
    master = SharedTrainingMaster(batch_size_per_worker=16, num_workers=2, rdd_training_approach="direct")
    with pytest.raises(TrainingError, match=r"the updater diverged\. Lower the learning rate") as info:
        SparkNetwork(spark, _diverging(), master, progress=False).fit(digits_rdd, epochs=1)
    assert "lr=1000000000000.0" in str(info.value) and "exploded" in str(info.value)


def test_on_divergence_warn_trains_on_and_warns_on_the_driver(spark, digits_rdd) -> None:
    master = SharedTrainingMaster(
        batch_size_per_worker=16, num_workers=2, rdd_training_approach="direct", on_divergence="warn"
    )
    net = _diverging()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SparkNetwork(spark, net, master, progress=False).fit(digits_rdd, epochs=1)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("training diverged" in m and "Lower the learning rate" in m for m in messages), messages
    assert "Lower the learning rate" in net.extra_config["sharing.divergence"]
    assert net.epoch == 1  # the fit ran to its end


def test_healthy_gradient_sharing_reports_no_divergence(spark, digits_rdd) -> None:
    master = SharedTrainingMaster(batch_size_per_worker=16, num_workers=2, rdd_training_approach="direct")
    net = Network(models.mlp(64, 16, 10), updater=optim.Adam(lr=1e-2), seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        SparkNetwork(spark, net, master, progress=False).fit(digits_rdd, epochs=1)
    assert net.extra_config["sharing.divergence"] is None


@pytest.mark.parametrize("approach", ["export", "direct"])
def test_drop_last_trains_only_full_minibatches(spark, sc, approach: str) -> None:
    data = datasets.synthetic_classification(66, 6, 3, seed=1)
    rdd = sc.parallelize([data.slice(0, 30), data.slice(30, 66)], 2)
    results = {}
    for drop_last in (False, True):
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=16,
            num_workers=2,
            averaging_frequency=1,
            rdd_training_approach=approach,
            drop_last=drop_last,
        )
        spark_net = SparkNetwork(spark, Network(models.mlp(6, 8, 3), seed=0), master, progress=False)
        spark_net.fit(rdd, epochs=1)
        spark_net.delete_temp_files()
        results[drop_last] = sorted((r.examples, r.iterations) for r in spark_net.last_results)
    assert results[False] == [(33, 2), (33, 3)]  # worker 0: 16 + 17 (no 1-example minibatch); worker 1: 15, 16, 2
    assert results[True] == [(32, 2), (32, 2)]  # 4 full minibatches of 16; the 2 left over are not trained


def test_batchnorm_network_trains_on_the_split_that_used_to_leave_one_example(spark, sc) -> None:
    """66 examples, 2 workers, batch 16 gave worker 0 a last minibatch of 1 example: BatchNorm raised mid-fit."""
    data = datasets.synthetic_classification(66, 6, 3, seed=1)
    module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16, num_workers=2, averaging_frequency=1, rdd_training_approach="direct"
    )
    net = Network(module, seed=0)
    SparkNetwork(spark, net, master, progress=False).fit(sc.parallelize([data], 1), epochs=1)
    assert net.epoch == 1
