"""SparkNetwork takes its runner: the in-process runner trains the partitions SparkNetwork prepared, through the
same driver (task, progress, stats, merge), and gives the barrier stage's result."""

from __future__ import annotations

from functools import partial

import torch

from helpers import assert_replicas_identical, mlp_net
from torchspark import DataSet, datasets, optim
from torchspark.errors import DataError, WorkerError
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork
from torchspark.training import InProcessRunner

BATCH = 8


_net = partial(mlp_net, 12, 16, 3, updater=optim.Adam(lr=1e-2))


def _rdd(sc, seed: int = 1):  # 12 minibatches per worker and epoch: progress is sent every 10
    return sc.parallelize(datasets.synthetic_classification(192, 12, 3, seed=seed).split(48), 2)


def test_the_in_process_runner_trains_what_spark_prepared_like_the_barrier_stage(spark, sc) -> None:
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=BATCH,
        averaging_frequency=2,
        num_workers=2,
        rng_seed=3,
        rdd_training_approach="direct",
        collect_training_stats=True,
    )
    on_spark, in_process = _net(), _net()
    SparkNetwork(spark, on_spark, master, progress=False).fit(_rdd(sc), epochs=2)
    runner = InProcessRunner(timeout_s=60)
    spark_net = SparkNetwork(spark, in_process, master, progress=False, runner=runner)
    updates = []
    spark_net.add_progress_listener(updates.append)
    spark_net.fit(_rdd(sc), epochs=2)

    assert (in_process.iteration, in_process.epoch) == (on_spark.iteration, on_spark.epoch) == (24, 2)
    torch.testing.assert_close(in_process.params(), on_spark.params(), atol=1e-6, rtol=1e-5)
    assert [r.examples for r in spark_net.last_results] == [192, 192]
    assert updates, "the in-process workers' progress did not reach the listeners through the driver"
    stats = spark_net.training_stats
    assert stats is not None and stats.summary()["examples"] == 2 * 192
    summary = stats.summary()
    assert set(summary["worker_ids"]) == {"driver", "worker-0", "worker-1"} and summary["workers"] == 2
    assert summary["seconds"]["fit"] > 0 and summary["counts"]["network_init"] == 2


def test_gradient_sharing_through_an_injected_runner_learns(spark, sc) -> None:
    net = _net()
    before = net.score(datasets.synthetic_classification(192, 12, 3, seed=1))
    master = SharedTrainingMaster(batch_size_per_worker=BATCH, num_workers=2, rdd_training_approach="direct")
    spark_net = SparkNetwork(spark, net, master, progress=False, runner=InProcessRunner(timeout_s=60))
    spark_net.fit(_rdd(sc), epochs=3)
    assert net.score(datasets.synthetic_classification(192, 12, 3, seed=1)) < before
    assert_replicas_identical(spark_net, 2, net=net)


def test_an_executor_data_error_mid_training_stays_a_data_error(spark, sc) -> None:
    """Labels out of range in a later minibatch pass the driver's first-minibatch check; the worker that meets
    them raises DataError, which the driver raises as a DataError (and WorkerError) on every route."""
    data = datasets.synthetic_classification(64, 12, 3, seed=2)
    labels = data.labels.clone()
    labels[40:48] = 7
    rdd = sc.parallelize(DataSet(data.features, labels).split(32), 2)
    for via, runner in (("torch", None), ("spark", None), ("torch", InProcessRunner(timeout_s=60))):
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=BATCH,
            num_workers=2,
            averaging_frequency=1,
            repartition="never",
            rdd_training_approach="direct",
            averaging_via=via,
            rendezvous_timeout_s=60,
        )
        try:
            SparkNetwork(spark, _net(), master, progress=False, runner=runner).fit(rdd)
        except DataError as e:
            assert isinstance(e, WorkerError), (via, runner, type(e))
            assert "label index 7" in str(e) and "Traceback" in str(e), str(e)
        else:
            raise AssertionError(f"no DataError with averaging_via={via!r}, runner={runner!r}")
