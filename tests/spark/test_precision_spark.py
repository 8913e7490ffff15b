"""Both masters on a real local Spark session train at the network's precision (bf16): the executors' replicas are
built from the blueprint, which carries it, and the fit equals the single-process reference of the bf16 network,
not the fp32 one."""

from __future__ import annotations

import pytest
import torch

from reference_loops import averaging_reference, sharing_reference
from torchspark import Network, datasets, models, optim
from torchspark.encoding import AdaptiveThreshold, EncoderConfig
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

SHARDS = [datasets.synthetic_classification(48, 12, 3, seed=s).split(8) for s in (1, 2)]  # 6 minibatches each


def _net(precision: str, updater: optim.UpdaterSpec) -> Network:
    return Network(models.mlp(12, 16, 3), updater=updater, seed=0, precision=precision)


def test_gradient_sharing_on_spark_trains_in_bf16(spark, sc) -> None:
    encoder = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3))
    updater = optim.SGD(lr=0.1, momentum=0.9)
    net = _net("bf16", updater)
    expected, _ = sharing_reference(net, SHARDS, epochs=2, overlap=True, encoder=encoder)
    fp32, _ = sharing_reference(_net("fp32", updater), SHARDS, epochs=2, overlap=True, encoder=encoder)
    master = SharedTrainingMaster(
        batch_size_per_worker=8, num_workers=2, repartition="never", threshold_algorithm=encoder.threshold_policy
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(SHARDS[0] + SHARDS[1], 2), epochs=2)
    spark_net.delete_temp_files()
    torch.testing.assert_close(net.params(), expected[0].params())
    assert not torch.allclose(net.params(), fp32[0].params(), atol=1e-5)


@pytest.mark.parametrize("via", ["torch", "spark"])
def test_parameter_averaging_on_spark_trains_in_bf16(spark, sc, via: str) -> None:
    updater = optim.SGD(lr=0.1)
    net = _net("bf16", updater)
    expected = averaging_reference(net, SHARDS, epochs=1, frequency=2, save_updater=True)
    fp32 = averaging_reference(_net("fp32", updater), SHARDS, epochs=1, frequency=2, save_updater=True)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8,
        averaging_frequency=2,
        num_workers=2,
        repartition="never",
        rdd_training_approach="direct",
        averaging_via=via,
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(SHARDS, 2).flatMap(lambda shard: shard))  # partition i = shard i
    spark_net.delete_temp_files()
    torch.testing.assert_close(net.params(), expected.params(), atol=1e-5, rtol=0)
    assert not torch.allclose(net.params(), fp32.params(), atol=1e-4)
