"""Both masters on a real local Spark session step a torch optimizer's learning-rate scheduler on every executor at
the replicas' own step count: the fit equals the reference loops' replicas, whose schedulers follow the same
count, and the driver's network continues the schedule where the workers left it."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR

from reference_loops import averaging_reference, sharing_reference
from torchspark import Network, datasets, models
from torchspark.encoding import AdaptiveThreshold, EncoderConfig
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

SHARDS = [datasets.synthetic_classification(48, 12, 3, seed=s).split(8) for s in (1, 2)]  # 6 minibatches each
SGD = functools.partial(torch.optim.SGD, lr=0.2, momentum=0.9)


def _net(scheduled: bool) -> Network:
    # partials of torch classes: the executors rebuild them from JSON, nothing pickled
    cosine = functools.partial(CosineAnnealingLR, T_max=12) if scheduled else None
    return Network(models.mlp(12, 16, 3), updater=SGD, seed=0, lr_scheduler=cosine)


@pytest.mark.parametrize("master", ["averaging", "sharing"])
def test_both_masters_step_a_torch_scheduler_on_every_executor(spark, sc, master: str) -> None:
    net = _net(True)
    if master == "averaging":
        expected = averaging_reference(net, SHARDS, epochs=2, frequency=2, save_updater=True)
        fixed = averaging_reference(_net(False), SHARDS, epochs=2, frequency=2, save_updater=True)
        config = ParameterAveragingTrainingMaster(
            batch_size_per_worker=8,
            averaging_frequency=2,
            num_workers=2,
            repartition="never",
            rdd_training_approach="direct",
        )
        data = sc.parallelize(SHARDS, 2).flatMap(lambda shard: shard)  # partition i = shard i
    else:
        encoder = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3))
        expected = sharing_reference(net, SHARDS, epochs=2, overlap=True, encoder=encoder)[0][0]
        fixed = sharing_reference(_net(False), SHARDS, epochs=2, overlap=True, encoder=encoder)[0][0]
        config = SharedTrainingMaster(
            batch_size_per_worker=8, num_workers=2, repartition="never", threshold_algorithm=encoder.threshold_policy
        )
        data = sc.parallelize(SHARDS[0] + SHARDS[1], 2)
    spark_net = SparkNetwork(spark, net, config, progress=False)
    spark_net.fit(data, epochs=2)
    spark_net.delete_temp_files()
    torch.testing.assert_close(net.params(), expected.params(), atol=1e-5, rtol=0)
    assert not torch.allclose(net.params(), fixed.params(), atol=1e-4), "the schedule must matter"
    assert net.iteration == expected.iteration == 12
    assert net.current_lr() == expected.current_lr() == pytest.approx(0.0, abs=1e-12)  # the end of the cosine
