"""BatchNorm running statistics trained on Spark workers reach the driver's network (all training routes)."""

from __future__ import annotations

from functools import partial

import torch

from helpers import batchnorm_net
from torchspark import datasets, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

_bn_net = partial(batchnorm_net, updater=optim.SGD(lr=0.1))


def test_identical_shards_reproduce_single_worker_statistics_on_both_averaging_routes(spark, sc) -> None:
    batches = datasets.synthetic_classification(80, 12, 3, seed=5).split(10)
    rdd = sc.parallelize([b for _ in range(2) for b in batches], 2)  # each partition: the same 8 batches
    reference = _bn_net()
    reference.fit(batches, epochs=1)
    initial = _bn_net().buffers()
    for via in ("torch", "spark"):
        net = _bn_net()
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=10, averaging_frequency=3, num_workers=2, repartition="never", averaging_via=via
        )
        snet = SparkNetwork(spark, net, master, progress=False)
        snet.fit(rdd)
        snet.delete_temp_files()
        assert not torch.allclose(net.buffers(), initial), via
        torch.testing.assert_close(net.buffers(), reference.buffers(), atol=1e-5, rtol=0, msg=via)
        torch.testing.assert_close(net.params(), reference.params(), atol=1e-5, rtol=0, msg=via)
        assert int(net.module[1].num_batches_tracked) == 8, via


def test_gradient_sharing_returns_trained_statistics(spark, sc) -> None:
    net = _bn_net()
    initial = net.buffers()
    rdd = sc.parallelize(datasets.synthetic_classification(96, 12, 3, seed=6).split(12), 2)
    snet = SparkNetwork(spark, net, SharedTrainingMaster(batch_size_per_worker=12, num_workers=2), progress=False)
    snet.fit(rdd)
    snet.delete_temp_files()
    assert torch.isfinite(net.buffers()).all() and not torch.allclose(net.buffers(), initial)
