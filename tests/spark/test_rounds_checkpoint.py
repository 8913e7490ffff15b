"""``averaging_via="spark"`` checkpoints per epoch (or every ``checkpoint_every`` rounds) on the driver, so a retry or
a later fit with the same run id continues from the newest checkpoint instead of the fit's start (local[2])."""

from __future__ import annotations

import shutil
from functools import partial

import pytest
import torch

from helpers import mlp_net
from torchspark import DataSet, Network, datasets, optim
from torchspark.errors import ConfigError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork
from torchspark.training.checkpoint import complete_checkpoints, store

_net = partial(mlp_net, 8, 16, 3, updater=optim.Adam(lr=1e-2))


def _parts() -> list[DataSet]:
    return [datasets.synthetic_classification(64, 8, 3, seed=0), datasets.synthetic_classification(48, 8, 3, seed=1)]


def _fit(spark, sc, net: Network, epochs: int, run_id: str | None = None, **options) -> SparkNetwork:
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16,
        averaging_frequency=2,
        num_workers=2,
        repartition="never",
        averaging_via="spark",
        **options,
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(_parts(), 2), epochs=epochs, run_id=run_id)
    spark_net.delete_temp_files()
    return spark_net


def test_the_rounds_route_checkpoints_and_a_run_continues_where_it_stopped(spark, sc, tmp_path) -> None:
    reference = _net()
    _fit(spark, sc, reference, epochs=3)
    options = {"checkpoint_directory": str(tmp_path)}
    first = _net()
    _fit(spark, sc, first, epochs=2, run_id="r1", **options)
    found = complete_checkpoints(str(tmp_path), "r1")
    assert [c.manifest["fit_epoch"] for c in found] == [1, 2]  # one per epoch (2 rounds each: 64/16 / 2)
    assert store.read_rank_file(found[-1].path, 0)[1]["algo"]["rounds"] == {"workers": 2, "rounds": 2}
    longer = _net()
    spark_net = _fit(spark, sc, longer, epochs=3, run_id="r1", **options)  # trains only the third epoch
    assert torch.equal(longer.params(), reference.params())
    assert (longer.iteration, longer.epoch) == (reference.iteration, reference.epoch)
    assert [r.examples for r in spark_net.last_results] == [3 * 64, 3 * 48]  # the totals of one 3-epoch fit


def test_the_rounds_route_resumes_mid_epoch_from_a_round_checkpoint(spark, sc, tmp_path) -> None:
    reference = _net()
    _fit(spark, sc, reference, epochs=1)
    options = {"checkpoint_directory": str(tmp_path), "checkpoint_every": 1}
    _fit(spark, sc, _net(), epochs=1, run_id="r1", **options)
    found = complete_checkpoints(str(tmp_path), "r1")
    mid = found[0]
    assert (mid.manifest["fit_epoch"], store.read_rank_file(mid.path, 0)[1]["done"]) == (0, 1)  # after round 1
    shutil.rmtree(found[-1].path)  # as if the fit had stopped in round 2: the round-1 checkpoint is the newest
    resumed = _net()
    _fit(spark, sc, resumed, epochs=1, run_id="r1", **options)
    assert torch.equal(resumed.params(), reference.params())
    shutil.rmtree(complete_checkpoints(str(tmp_path), "r1")[-1].path)  # the round-1 checkpoint again
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16,
        averaging_frequency=2,
        num_workers=1,
        repartition="never",
        averaging_via="spark",
        **options,
    )
    with pytest.raises(ConfigError, match="written by a fit of .*'workers': 2.* but this one has 1 workers"):
        SparkNetwork(spark, _net(), master, progress=False).fit(sc.parallelize(_parts()[:1], 1), epochs=1, run_id="r1")
