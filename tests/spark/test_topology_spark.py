"""Gradient sharing's sharded topology on a real local[2] Spark session (gloo between the barrier tasks)."""

from __future__ import annotations

import torch

from torchspark import Network, datasets, models, optim
from torchspark.encoding import AdaptiveThreshold
from torchspark.spark import SharedTrainingMaster, SparkNetwork, master_from_json


def test_sharded_topology_fits_like_the_reference_loop(spark, sc) -> None:
    from reference_loops import sharing_reference
    from torchspark.encoding import EncoderConfig

    data = datasets.synthetic_classification(96, 12, 3, seed=1)
    first, second = data.split(8), datasets.synthetic_classification(96, 12, 3, seed=2).split(8)
    encoder = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3))
    net = Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.1, momentum=0.9), seed=0)
    replicas, _ = sharing_reference(net, [first, second], epochs=2, overlap=True, encoder=encoder)
    master = SharedTrainingMaster(
        batch_size_per_worker=8,
        num_workers=2,
        repartition="never",
        threshold_algorithm=encoder.threshold_policy,
        topology="sharded",
    )
    assert master_from_json(master.to_json()).topology == "sharded"
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(first + second, 2), epochs=2)
    spark_net.delete_temp_files()
    assert net.extra_config["sharing.topology"] == "sharded"
    checksums = [r.param_checksum for r in spark_net.last_results]
    assert len(checksums) == 2 and checksums[0] is not None and checksums[0] == checksums[1]
    assert net.extra_config["sharing.bytes_sent"] > 0
    torch.testing.assert_close(net.params(), replicas[0].params())
