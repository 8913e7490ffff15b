"""Gradient sharing (SharedTrainingMaster) on a real local[2] Spark session with real torch."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from helpers import assert_replicas_identical, lenet_net
from torchspark import DataSet, Network, datasets, models, optim
from torchspark.encoding import AdaptiveThreshold, FixedThreshold, NoResidualPostProcessing, ResidualClipping
from torchspark.errors import ConfigError, WorkerError
from torchspark.spark import SharedTrainingMaster, SparkNetwork, master_from_json


def test_digits_lenet_accuracy_traffic_and_identical_replicas(spark, sc) -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    net = lenet_net(updater=optim.Adam(lr=1e-3))
    # Adam steps are ~lr = 1e-3 per parameter; starting the threshold 10x above that skips ~150 dense warm-up steps
    master = SharedTrainingMaster(
        batch_size_per_worker=16, threshold_algorithm=AdaptiveThreshold(initial=1e-2), rng_seed=0, num_workers=2
    )
    spark_net = SparkNetwork(spark, net, master)
    spark_net.fit(sc.parallelize(train.split(64), 4), epochs=8)
    spark_net.delete_temp_files()

    accuracy = net.evaluate(test).accuracy()
    assert accuracy >= 0.95, accuracy
    assert net.epoch == 8
    cfg = net.extra_config
    assert cfg["sharing.world_size"] == 2
    assert_replicas_identical(spark_net, 2, net=net)
    assert cfg["sharing.dense_bytes"] == 4 * net.num_params() * sum(r.iterations for r in spark_net.last_results)
    ratio = cfg["sharing.bytes_sent"] / cfg["sharing.dense_bytes"]
    assert ratio <= 0.05, ratio
    assert {"sharing.residual.0", "sharing.residual.1", "sharing.threshold_state"} <= set(net.extra_state)


@pytest.mark.parametrize("identical", [True, False])
def test_spark_run_matches_the_reference_loop(spark, sc, identical: bool) -> None:
    from reference_loops import sharing_reference
    from torchspark.encoding import EncoderConfig

    data = datasets.synthetic_classification(96, 12, 3, seed=1)
    first = data.split(8)
    second = first if identical else datasets.synthetic_classification(96, 12, 3, seed=2).split(8)
    encoder = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3), shake_frequency=4)
    net = Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.1, momentum=0.9), seed=0)
    replicas, _ = sharing_reference(net, [first, second], epochs=2, overlap=True, encoder=encoder)
    master = SharedTrainingMaster(
        batch_size_per_worker=8,
        num_workers=2,
        repartition="never",
        threshold_algorithm=encoder.threshold_policy,
        shake_frequency=4,
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(first + second, 2), epochs=2)
    spark_net.delete_temp_files()
    torch.testing.assert_close(net.params(), replicas[0].params())
    torch.testing.assert_close(net.updater_state(), torch.stack([r.updater_state() for r in replicas]).mean(0))


def test_worker_error_fails_cleanly(spark, sc) -> None:
    g = torch.Generator().manual_seed(0)
    good = DataSet(torch.rand(32, 1, 8, 8, generator=g), torch.zeros(32, dtype=torch.long))
    x = torch.rand(32, 1, 8, 8, generator=g)
    x[20] = float("nan")  # second minibatch of the second worker: it fails mid-fit, its peer is mid-exchange
    poisoned = DataSet(x, torch.zeros(32, dtype=torch.long))
    master = SharedTrainingMaster(
        batch_size_per_worker=8,
        num_workers=2,
        repartition="never",
        rdd_training_approach="direct",
        rendezvous_timeout_s=60,
    )
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(WorkerError, match="NaN at example") as info:
        SparkNetwork(spark, Network(models.mlp(64, 8, 10), seed=0), master).fit(sc.parallelize([good, poisoned], 2))
    assert "Traceback" in str(info.value)
    assert not dist.is_initialized()
    leftover = {t.name for t in threading.enumerate()} - before
    assert not [n for n in leftover if n.startswith("torchspark")], leftover
    assert sc.parallelize(range(4), 2).sum() == 6  # the session still works


def test_master_json_round_trip_and_validation() -> None:
    master = SharedTrainingMaster(
        batch_size_per_worker=32,
        threshold_algorithm=FixedThreshold(2e-3),
        residual_post_processor=NoResidualPostProcessing(),
        shake_frequency=50,
        workers_per_node=2,
        port=40000,
        network_mask="10.0.0.0/16",
        controller_address="10.0.0.5",
        overlap=False,
        rng_seed=7,
        rdd_training_approach="direct",
        export_directory="/tmp/x",
    )
    text = master.to_json()
    assert SharedTrainingMaster.from_json(text) == master
    assert master_from_json(text) == master
    assert '"type": "fixed"' in text and '"type": "sharing"' in text
    default = SharedTrainingMaster()
    assert default.threshold_algorithm == AdaptiveThreshold()
    assert default.residual_post_processor == ResidualClipping()
    assert SharedTrainingMaster.from_json(default.to_json()) == default
    hash(default)  # frozen and hashable: policies are stored as frozen objects
    settings = master.algorithm_settings()
    assert settings["overlap"] is False and settings["encoder"]["shake_frequency"] == 50
    assert settings["encoder"]["threshold_policy"] == {"type": "fixed", "threshold": 2e-3}
    assert SharedTrainingMaster(
        threshold_algorithm={"type": "adaptive", "initial": 1e-2}
    ).threshold_algorithm == AdaptiveThreshold(initial=1e-2)
    assert master.resolve_num_workers(default_parallelism=8, executors=3) == 6
    assert default.resolve_num_workers(default_parallelism=8, executors=3) == 8
    for bad, match in [
        ({"workers_per_node": 0}, "workers_per_node must be -1"),
        ({"shake_frequency": -1}, "shake_frequency must be an integer >= 0"),
        ({"port": 70000}, r"port must be an integer in \[0, 65535\]"),
        ({"network_mask": "10.0.0"}, "network_mask must be a CIDR"),
        ({"controller_address": ""}, "controller_address"),
        ({"overlap": "yes"}, "overlap must be True or False"),
        ({"threshold_algorithm": 1e-3}, "threshold_algorithm must be a policy object"),
        ({"threshold_algorithm": {"type": "magic"}}, "unknown threshold policy type"),
        ({"residual_post_processor": "clip"}, "residual_post_processor must be a policy object"),
        ({"batch_size_per_worker": 0}, "batch_size_per_worker must be an integer >= 1, got 0"),
    ]:
        with pytest.raises(ConfigError, match=match):
            SharedTrainingMaster(**bad)


def test_max_staleness_on_spark_averages_the_replicas_at_the_end(spark, sc) -> None:
    """Bounded staleness inside a Spark barrier stage (gloo point-to-point between the tasks)."""
    data = datasets.synthetic_classification(192, 12, 3, seed=1)
    net = Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.1, momentum=0.9), seed=0)
    master = SharedTrainingMaster(
        batch_size_per_worker=8, num_workers=2, max_staleness=2, threshold_algorithm=AdaptiveThreshold(initial=1e-3)
    )
    assert master_from_json(master.to_json()).max_staleness == 2
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(data.split(8), 2), epochs=2)
    spark_net.delete_temp_files()
    cfg = net.extra_config
    steps = sum(r.iterations for r in spark_net.last_results)
    assert steps == 2 * 24
    assert cfg["sharing.max_staleness"] == 2 and 0 <= cfg["sharing.max_lag_steps"] <= 2
    assert cfg["sharing.messages_sent"] == steps and cfg["sharing.messages_applied"] == 2 * steps
    assert_replicas_identical(spark_net, 2, net=net)
    assert net.evaluate(data).accuracy() > 0.5
