"""Weights larger than one Spark Connect message: a dedicated server whose ``spark.connect.grpc.maxInboundMessageSize``
is 4 MiB, and a ~6.4 MB network. The blueprint then travels as session artifacts and the trained weights come back
as rows of 1 MiB parts; forced into the task's closure, the same fit is refused by the server (so the artifact
route is what makes it work)."""

from __future__ import annotations

import pytest
import torch

from helpers import mlp_net
from torchspark import datasets, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork
from torchspark.spark.connect import start_connect_server
from torchspark.spark.connect.runner import ConnectBarrierRunner
from torchspark.spark.connect.shipping import message_cap

CAP = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def small_cap_spark():
    from pyspark.sql import SparkSession

    server = start_connect_server(
        "local[2]", conf={"spark.barrier.sync.timeout": "120", "spark.connect.grpc.maxInboundMessageSize": str(CAP)}
    )
    spark = SparkSession.builder.remote(server.url).create()  # beside the tier's own session
    try:
        yield spark
    finally:
        spark.stop()
        server.stop()


def test_a_network_larger_than_one_message_trains(small_cap_spark) -> None:
    spark = small_cap_spark
    assert message_cap(spark) == CAP
    data = datasets.synthetic_classification(64, 12, 3, seed=1)
    rows = [(x.double().tolist(), int(y)) for x, y in zip(data.features, data.labels)]
    df = spark.createDataFrame(rows, "features array<double>, label long")
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, num_workers=2)

    net = mlp_net(12, 100_000, 3, updater=optim.SGD(lr=0.01, momentum=0.9))
    assert net.params().numel() * 4 > CAP  # the weights alone outgrow one message
    before = net.params().clone()
    SparkNetwork(spark, net, master, progress=False).fit(df)
    assert not torch.equal(net.params(), before)
    assert net.updater_state().abs().sum() > 0  # the momentum came back too (another ~6.4 MB)

    inline = ConnectBarrierRunner(spark, master.mesh, inline_limit=1 << 30)
    with pytest.raises(Exception, match="exceeds maximum size"):
        SparkNetwork(spark, mlp_net(12, 100_000, 3), master, progress=False, runner=inline).fit(df)
