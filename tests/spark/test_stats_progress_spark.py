"""Training stats and live progress from a real 2-worker Spark fit."""

from __future__ import annotations

from helpers import assert_replicas_identical
from torchspark import Network, datasets, models, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork
from torchspark.stats import STANDARD_PHASES


def test_stats_html_names_workers_and_phases_and_progress_arrives_live(spark, sc, tmp_path) -> None:
    data = datasets.synthetic_classification(640, 16, 4, seed=0)
    net = Network(models.mlp(16, 16, 4), updater=optim.Adam(lr=1e-2), seed=0)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8, averaging_frequency=2, num_workers=2, collect_training_stats=True
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    during_job: list[bool] = []
    updates = []

    def listener(update) -> None:  # runs on a driver thread while the barrier job is running
        updates.append(update)
        during_job.append(bool(sc.statusTracker().getActiveJobsIds()))

    spark_net.add_progress_listener(listener)
    spark_net.fit(sc.parallelize(data.split(32), 2), epochs=2)

    assert updates, "no progress reached the driver"
    assert all(during_job), "progress arrived only after the training job ended"
    assert {u.rank for u in updates} == {0, 1}

    stats = spark_net.training_stats
    summary = stats.summary()
    assert summary["workers"] == 2
    assert summary["examples"] == 2 * 640
    assert summary["epochs"] == 2
    assert summary["iterations"] == 2 * 640 // 8 // 2  # per worker
    # worker phases and driver phases are counted apart: one worker "fit" per minibatch trained
    assert summary["counts"]["fit"] == summary["minibatches"] == 2 * 640 // 8
    for phase in ("fit", "data_wait", "averaging", "network_init"):
        assert summary["seconds"].get(phase, 0) > 0, phase
    for phase in ("export", "broadcast", "fit", "aggregation"):
        assert summary["driver_seconds"].get(phase, 0) > 0, phase
    assert summary["driver_counts"]["fit"] == 1  # the driver's span of the one barrier stage
    path = tmp_path / "stats.html"
    stats.export_html(str(path))
    html = path.read_text()
    for name in ("worker-0", "worker-1", "driver", "fit", "averaging", "data_wait", "network_init"):
        assert name in html, name
    assert set(summary["seconds"]) | set(summary["driver_seconds"]) <= set(STANDARD_PHASES)
    # the JSON round trip keeps the summary
    from torchspark.stats import TrainingStats

    assert TrainingStats.from_json(stats.to_json()).summary()["examples"] == 2 * 640


def test_direct_route_times_count_and_repartition(spark, sc) -> None:
    data = datasets.synthetic_classification(256, 8, 3, seed=1)
    net = Network(models.mlp(8, 8, 3), seed=0)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16, num_workers=2, rdd_training_approach="direct", collect_training_stats=True
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(data.split(64), 3), epochs=1)
    summary = spark_net.training_stats.summary()
    for phase in ("count", "repartition", "broadcast", "fit"):
        assert summary["driver_seconds"].get(phase, 0) > 0, phase
    for phase in ("fit", "averaging"):
        assert summary["seconds"].get(phase, 0) > 0, phase


def test_sharing_stats_report_traffic_and_identical_replicas(spark, sc, tmp_path) -> None:
    from torchspark.encoding import AdaptiveThreshold
    from torchspark.spark import SharedTrainingMaster

    data = datasets.synthetic_classification(512, 16, 4, seed=2)
    net = Network(models.mlp(16, 32, 4), updater=optim.Adam(lr=1e-2), seed=0)
    master = SharedTrainingMaster(
        batch_size_per_worker=16,
        num_workers=2,
        collect_training_stats=True,
        threshold_algorithm=AdaptiveThreshold(initial=1e-2),
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(data.split(64), 2), epochs=1)
    summary = spark_net.training_stats.summary()
    assert summary["replicas_identical"] is True
    assert_replicas_identical(summary, 2, net=net)
    assert 0 < summary["bytes_sent"] < summary["dense_bytes"]
    assert summary["seconds"].get("exchange", 0) > 0
    path = tmp_path / "sharing.html"
    spark_net.training_stats.export_html(str(path))
    html = path.read_text()
    assert "Gradient encoding" in html and "exchange" in html
