"""Every option of the masters and SparkNetwork works or is refused, on a real local[2] session: rng_seed with the
routes that used to ignore it, storage_level names, workers_per_node against the session's executors, the import
check on every executor, and the replicas' checksums measured after a fit.

local-cluster checks (two executor JVMs) run in a child process: ``scripts/local_cluster_fit.py``, through the
``local_cluster_runs`` fixture shared with test_local_cluster.py."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from helpers import mlp_net
from torchspark import datasets, optim
from torchspark.errors import SetupError
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork
from torchspark.spark.preflight import probe_executors
from torchspark.training.config.masters import STORAGE_LEVELS
from torchspark.training.task import param_checksum

_net = partial(mlp_net, 6, 8, 3, updater=optim.SGD(lr=0.1))


def _data(sc):
    parts = datasets.synthetic_classification(192, 6, 3, seed=3).split(48)  # 4 partitions of 48 = 6 minibatches
    return sc.parallelize(parts, 2)


def test_old_names_are_refused(spark) -> None:
    """One vocabulary: ``master=`` (not ``training_master=``), ``score`` and ``collect_training_stats`` properties."""
    with pytest.raises(TypeError, match="training_master"):
        SparkNetwork(spark, _net(), training_master=ParameterAveragingTrainingMaster())
    spark_net = SparkNetwork(spark, _net(), ParameterAveragingTrainingMaster(), progress=False)
    spark_net.collect_training_stats = True
    assert spark_net.collect_training_stats and spark_net.master == ParameterAveragingTrainingMaster()
    for old in ("get_score", "set_collect_training_stats", "training_master"):
        assert not hasattr(spark_net, old)


def test_storage_level_names_are_pysparks() -> None:
    from pyspark import StorageLevel

    names = {n for n in dir(StorageLevel) if isinstance(getattr(StorageLevel, n), StorageLevel)}
    assert set(STORAGE_LEVELS) == names and len(STORAGE_LEVELS) == len(names)


@pytest.mark.parametrize("approach", ["export", "direct"])
@pytest.mark.parametrize("repartition, strategy", [("never", "balanced"), ("always", "spark_default")])
def test_rng_seed_changes_the_training_order(spark, sc, repartition, strategy, approach) -> None:
    """The same seed gives the same parameters run to run (fresh SparkNetworks, no cached preparation); another
    seed, or none, another order and so other parameters. With SGD and averaging every 3 minibatches the order
    inside a round decides the parameters."""
    data = _data(sc)

    def fit(seed):
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=8,
            averaging_frequency=3,
            num_workers=2,
            repartition=repartition,
            repartition_strategy=strategy,
            rdd_training_approach=approach,
            rng_seed=seed,
        )
        spark_net = SparkNetwork(spark, _net(), master, progress=False)
        spark_net.fit(data, epochs=1)
        spark_net.delete_temp_files()
        assert sum(r.examples for r in spark_net.last_results) == 192  # every example once, whatever the order
        return spark_net.network.params()

    first, again, other, unseeded = fit(1), fit(1), fit(2), fit(None)
    torch.testing.assert_close(first, again, atol=0, rtol=0)
    assert (first - other).abs().max() > 1e-4
    assert (first - unseeded).abs().max() > 1e-4


def test_rng_seed_with_repartition_never_keeps_each_workers_partition(spark, sc) -> None:
    """Seeded, each worker still trains exactly its own partition (48 vs 96 examples), only the order changes."""
    parts = datasets.synthetic_classification(144, 6, 3, seed=4)
    rdd = sc.parallelize([parts.slice(0, 48), parts.slice(48, 144)], 2)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=8, num_workers=2, repartition="never", rng_seed=9)
    spark_net = SparkNetwork(spark, _net(), master, progress=False)
    spark_net.fit(rdd)
    spark_net.delete_temp_files()
    assert [r.examples for r in spark_net.last_results] == [48, 96]


@pytest.mark.parametrize("level", ["MEMORY_AND_DISK", "DISK_ONLY"])
def test_storage_level_is_used_by_the_direct_route(spark, sc, level) -> None:
    data = _data(sc)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8, num_workers=2, rdd_training_approach="direct", storage_level=level
    )
    spark_net = SparkNetwork(spark, _net(), master, progress=False)
    spark_net.fit(data)
    (prepared,) = spark_net.preparation.persisted.values()
    assert str(prepared.getStorageLevel()) == str(getattr(__import__("pyspark").StorageLevel, level))
    spark_net.delete_temp_files()


def test_workers_per_node_on_local_mode_counts_one_executor(spark, sc) -> None:
    """local[2] is one executor with two slots: k=1 trains one worker, k=2 two, k=3 does not fit."""
    data = _data(sc)
    for k in (1, 2):
        spark_net = SparkNetwork(
            spark, _net(), SharedTrainingMaster(batch_size_per_worker=8, workers_per_node=k), progress=False
        )
        spark_net.fit(data)
        spark_net.delete_temp_files()
        assert len(spark_net.last_results) == k
    with pytest.raises(SetupError, match=r"workers_per_node=3 but the session's 1 executor\(s\) have 2 task slot"):
        SparkNetwork(spark, _net(), SharedTrainingMaster(workers_per_node=3), progress=False).fit(data)


def test_import_check_reaches_the_local_executor(sc) -> None:
    probed = probe_executors(sc)
    assert len(probed) == 1
    (versions,) = probed.values()
    assert versions.startswith(f"torch {torch.__version__}, torchspark ")


@pytest.mark.parametrize(
    "master",
    [
        ParameterAveragingTrainingMaster(
            batch_size_per_worker=8, averaging_frequency=2, num_workers=2, collect_training_stats=True
        ),
        SharedTrainingMaster(batch_size_per_worker=8, num_workers=2, collect_training_stats=True),
    ],
    ids=["averaging", "sharing"],
)
def test_every_rank_reports_the_checksum_of_its_replica(spark, sc, master) -> None:
    net = _net()
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(_data(sc), epochs=2)
    spark_net.delete_temp_files()
    checksums = [r.param_checksum for r in spark_net.last_results]
    assert len(checksums) == 2 and checksums[0] == checksums[1] == param_checksum(net)
    summary = spark_net.training_stats.summary()
    assert summary["param_checksums"] == {"0": checksums[0], "1": checksums[1]}
    assert summary["replicas_identical"] is True


@pytest.mark.cluster
def test_local_cluster_probes_every_executor_and_places_workers_per_node(local_cluster_runs) -> None:
    result = local_cluster_runs["options"]
    assert "error" not in result, result["error"]
    assert result["executor_count"] == 2
    assert len(result["probed"]) == 2, result  # both executor JVMs imported torch, not just one
    assert len(result["versions"]) == 1 and result["versions"][0].startswith("torch ")
    assert result["workers_for_one_per_node"] == 2 and result["trained_ranks"] == [0, 1]
    assert sum(result["examples"]) == 128 and min(result["examples"]) > 0
    assert "workers_per_node=2 but the session's 2 executor(s) have 1 task slot(s) each" in result["two_per_node"]
