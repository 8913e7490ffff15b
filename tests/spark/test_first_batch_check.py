"""The driver's first-minibatch check (a Spark job per fit) runs once for repeated fits of the same data, and
again for anything that could change its outcome: other data, another master."""

from __future__ import annotations

import pytest

import torchspark.spark.network as spark_network
from helpers import mlp_net
from torchspark import DataSet, datasets, optim
from torchspark.errors import DataError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork


def _master(**options) -> ParameterAveragingTrainingMaster:
    return ParameterAveragingTrainingMaster(
        batch_size_per_worker=8, averaging_frequency=2, num_workers=2, rdd_training_approach="direct", **options
    )


def test_repeated_fits_of_the_same_data_check_the_first_minibatch_once(sc, spark, monkeypatch):
    checks = []
    real = spark_network.check_first_batch
    monkeypatch.setattr(spark_network, "check_first_batch", lambda net, item: (checks.append(1), real(net, item)))
    data = datasets.synthetic_classification(64, 8, 3, seed=0)
    rdd = sc.parallelize(data.split(16), 2)
    snet = SparkNetwork(spark, mlp_net(8, 16, 3, updater=optim.Adam(lr=1e-2)), _master(), progress=False)
    snet.fit(rdd, epochs=1)
    snet.fit(rdd, epochs=1)
    assert len(checks) == 1  # same RDD, master and network: the second fit runs no check job
    snet.master = _master(save_updater=False)
    snet.fit(rdd, epochs=1)
    assert len(checks) == 2  # another master may cut other minibatches: checked again
    bad = DataSet(data.features.clone(), data.labels)
    bad.features[0, 0] = float("nan")
    with pytest.raises(DataError, match="NaN"):  # new data is checked: the bad minibatch fails fast on the driver
        snet.fit(sc.parallelize(bad.split(16), 2), epochs=1)
    assert len(checks) == 3
    snet.fit(rdd, epochs=1)  # the data that passed last: a failed check does not replace what passed
    assert len(checks) == 3
