"""``repartition_strategy="balanced"`` on a real local[2] session: equal example counts per worker on both routes,
the same minibatches as ParallelWrapper's plan, and where the export route's files live and how they go."""

from __future__ import annotations

import os
import tempfile
from functools import partial

import pytest
import torch

from helpers import mlp_net, parts_of_sizes
from torchspark import DataSet, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork
from torchspark.spark.private_dirs import PREFIX
from torchspark.training.assignment import split_examples
from torchspark.training.worker.loop import load_item

SIZES = [37, 5, 100, 1]  # 143 examples: every partition boundary but the first is off the grid of 8
BATCH = 8


_parts = partial(parts_of_sizes, SIZES, n_features=6, seed=4)


def _master(approach: str, workers: int, **kw) -> ParameterAveragingTrainingMaster:
    return ParameterAveragingTrainingMaster(
        batch_size_per_worker=BATCH, averaging_frequency=2, num_workers=workers, rdd_training_approach=approach, **kw
    )


_net = partial(mlp_net, 6, 8, 3, updater=optim.SGD(lr=0.05))


@pytest.mark.parametrize("via", ["torch", "spark"])  # "spark": one job per round reads the same prepared data
@pytest.mark.parametrize("approach", ["export", "direct"])
def test_uneven_partitions_train_equal_examples_per_worker(spark, sc, approach: str, via: str) -> None:
    rdd = sc.parallelize(_parts(), len(SIZES))
    assert rdd.glom().map(lambda part: sum(len(d) for d in part)).collect() == SIZES
    master = _master(approach, 2, rng_seed=3, averaging_via=via)
    spark_net = SparkNetwork(spark, _net(), master, progress=False)
    spark_net.fit(rdd, epochs=1)
    spark_net.delete_temp_files()
    assert sorted(r.examples for r in spark_net.last_results) == [71, 72]
    assert spark_net.network.iteration == 9  # 8 + 1 + 7 x 8 + 7: the 1-example head joined its neighbour


def _prepared_minibatches(spark, rdd, master: ParameterAveragingTrainingMaster, workers: int) -> list[list[DataSet]]:
    """Every worker's prepared minibatches, loaded on the driver (a test may collect; the library never does)."""
    spark_net = SparkNetwork(spark, _net(), master, progress=False)
    base = spark_net.preparation.export_base(master) if master.rdd_training_approach == "export" else None
    worker_rdd = spark_net.preparation.from_rdd(rdd, master, workers, base)
    try:
        return [[load_item(item) for item in items] for items in worker_rdd.glom().collect()]
    finally:
        spark_net.delete_temp_files()


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("seed", [None, 5])
def test_export_direct_and_parallel_wrapper_get_the_same_minibatches(spark, sc, workers: int, seed) -> None:
    parts = _parts()
    rdd = sc.parallelize(parts, len(SIZES))
    expected = split_examples(parts, BATCH, workers, seed)  # ParallelWrapper's split of the same data
    assert [sum(len(b) for b in mine) for mine in expected] == ([71, 72] if workers == 2 else [47, 48, 48])
    for approach in ("export", "direct"):
        got = _prepared_minibatches(spark, rdd, _master(approach, workers, rng_seed=seed), workers)
        assert [[len(b) for b in mine] for mine in got] == [[len(b) for b in mine] for mine in expected], approach
        for mine, theirs in zip(got, expected):
            for batch, reference in zip(mine, theirs):
                torch.testing.assert_close(batch.features, reference.features, atol=0, rtol=0)
                torch.testing.assert_close(batch.labels, reference.labels, atol=0, rtol=0)


def test_repartition_never_keeps_each_partitions_own_minibatches(spark, sc) -> None:
    parts = parts_of_sizes([20, 13], n_features=6, seed=4)
    rdd = sc.parallelize(parts, 2)
    for approach in ("export", "direct"):
        got = _prepared_minibatches(spark, rdd, _master(approach, 2, repartition="never"), 2)
        assert [[len(b) for b in mine] for mine in got] == [[8, 8, 4], [8, 5]], approach
        torch.testing.assert_close(got[1][0].features, parts[1].features[:8], atol=0, rtol=0)


def test_delete_temp_files_removes_the_exported_files(spark, sc, tmp_path) -> None:
    spark_net = SparkNetwork(spark, _net(), _master("export", 2, export_directory=str(tmp_path)), progress=False)
    spark_net.fit(sc.parallelize(_parts(), len(SIZES)), epochs=1)
    assert len(list(tmp_path.rglob("*.safetensors"))) >= 143 // BATCH
    spark_net.delete_temp_files()
    assert list(tmp_path.rglob("*.safetensors")) == []
    assert list(tmp_path.iterdir()) == []


def test_default_export_goes_under_sparks_local_dir_and_is_removed(spark, sc) -> None:
    local_dir = sc.getConf().get("spark.local.dir", None)
    expected_base = (local_dir or tempfile.gettempdir()).split(",")[0].strip()
    spark_net = SparkNetwork(spark, _net(), _master("export", 2), progress=False)
    spark_net.fit(sc.parallelize(_parts(), len(SIZES)), epochs=1)
    directories = [export.directory for export in spark_net.preparation.exports.values()]
    private = {os.path.dirname(d) for d in directories}
    assert len(private) == 1 and all(os.path.dirname(p) == expected_base for p in private)
    assert all(os.path.basename(p).startswith(PREFIX) for p in private)
    assert all(any(name.endswith(".safetensors") for name in os.listdir(d)) for d in directories)
    spark_net.delete_temp_files()
    assert not any(os.path.exists(d) for d in [*directories, *private])
