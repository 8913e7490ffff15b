"""Checkpoints on Spark (barrier route, local[2]): a fit interrupted mid-epoch by a worker fault and resumed with the
same run id ends with the parameters of an uninterrupted fit (both masters; the RDD and the batch-file routes)."""

from __future__ import annotations

from functools import partial

import cloudpickle
import pytest
import torch

import interrupting
from helpers import onehot_rule_data
from interrupting import InterruptingMLP
from torchspark import Network, optim
from torchspark.data import save_batches
from torchspark.errors import ConfigError, WorkerError
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork
from torchspark.training.checkpoint import newest_checkpoint, store

cloudpickle.register_pickle_by_value(interrupting)  # executors rebuild the model without the tests on their path

BATCH = 8
EPOCHS = 3
PER_WORKER = 6  # 96 examples, 2 workers, minibatches of 8


_data = partial(onehot_rule_data, 96, seed=3)


def _net(after: int | None = None) -> Network:
    return Network(InterruptingMLP(12, 16, 3, after=after), updater=optim.Adam(lr=0.01), seed=0)


def _master(mode: str, **checkpoints):
    common = dict(batch_size_per_worker=BATCH, num_workers=2, rng_seed=5) | checkpoints
    if mode == "averaging":
        return ParameterAveragingTrainingMaster(averaging_frequency=3, **common)
    return SharedTrainingMaster(**common)


@pytest.mark.parametrize("mode, route", [("averaging", "rdd"), ("sharing", "paths")])
def test_a_fit_resumed_by_run_id_on_spark_matches_an_uninterrupted_one(spark, sc, tmp_path, mode, route) -> None:
    data = _data()
    paths = save_batches(data.split(BATCH), str(tmp_path / "batches")) if route == "paths" else None

    def fit(net: Network, master, run_id: str | None = None) -> SparkNetwork:
        spark_net = SparkNetwork(spark, net, master, progress=False)
        try:
            if paths is None:
                spark_net.fit(sc.parallelize(data.split(BATCH), 2), epochs=EPOCHS, run_id=run_id)
            else:
                spark_net.fit_paths(paths, epochs=EPOCHS, run_id=run_id)
        finally:
            spark_net.delete_temp_files()
        return spark_net

    reference = _net()
    fit(reference, _master(mode))

    checkpoints = dict(checkpoint_directory=str(tmp_path / "ckpt"), checkpoint_every=1 if mode == "averaging" else 2)
    with pytest.raises(WorkerError, match="worker stopped after 16 minibatches"):
        fit(_net(after=16), _master(mode, **checkpoints), run_id="r1")  # the 5th minibatch of epoch 2
    cut = newest_checkpoint(checkpoints["checkpoint_directory"], "r1")
    done = [store.read_rank_file(cut.path, rank)[1]["done"] for rank in (0, 1)]
    assert cut.manifest["fit_epoch"] == 2 and 0 < done[0] == done[1] < PER_WORKER

    resumed = _net(after=PER_WORKER - done[0])  # trains only what was left, or fails
    fit(resumed, _master(mode, **checkpoints), run_id="r1")
    if mode == "averaging":
        torch.testing.assert_close(resumed.params(), reference.params(), rtol=0, atol=1e-6)
    else:
        assert torch.equal(resumed.params(), reference.params())
    assert (resumed.iteration, resumed.epoch) == (reference.iteration, EPOCHS)


def test_run_id_without_a_checkpoint_directory_fails_before_any_job(spark, sc) -> None:
    spark_net = SparkNetwork(spark, _net(), _master("averaging"), progress=False)
    with pytest.raises(ConfigError, match="run_id='r1'.*no checkpoint_directory"):
        spark_net.fit(sc.parallelize(_data().split(BATCH), 2), run_id="r1")
    with pytest.raises(ConfigError, match="run_id='r1'.*no checkpoint_directory"):
        spark_net.fit_paths(["never-read.safetensors"], run_id="r1")


def _frame(spark, data):
    rows = [(data.features[i].tolist(), data.labels[i].tolist()) for i in range(len(data))]
    return spark.createDataFrame(rows, "features array<float>, label array<float>").coalesce(2)


@pytest.mark.parametrize("route", ["rdd", "dataframe", "paths"])
def test_a_mid_epoch_resume_whose_data_changed_is_refused_on_every_spark_route(spark, sc, tmp_path, route) -> None:
    """A cut inside the first epoch, whose minibatches the workers read once (no length up front): the issue's
    1,437 -> 1,000 examples was resumed silently. Another data size or order is refused by the workers, naming what
    changed (another batch_size_per_worker is the master's, refused by the driver); the same data resumes, also
    from batch files of other names."""
    written = iter(range(100))

    def fit(net: Network, data, run_id: str = "r1", **options) -> None:
        master = _master("averaging", checkpoint_directory=str(tmp_path / "ckpt"), checkpoint_every=1, **options)
        spark_net = SparkNetwork(spark, net, master, progress=False)
        try:
            if route == "rdd":
                spark_net.fit(sc.parallelize(data.split(BATCH), 2), epochs=1, run_id=run_id)
            elif route == "dataframe":
                spark_net.fit(_frame(spark, data), epochs=1, run_id=run_id)
            else:
                spark_net.fit_paths(save_batches(data.split(BATCH), str(tmp_path / f"b{next(written)}")), run_id=run_id)
        finally:
            spark_net.delete_temp_files()

    with pytest.raises(WorkerError, match="worker stopped after 3 minibatches"):
        fit(_net(after=3), _data())
    cut = newest_checkpoint(str(tmp_path / "ckpt"), "r1")
    assert (cut.manifest["fit_epoch"], store.read_rank_file(cut.path, 0)[1]["done"]) == (0, 3)

    for changed in (_data().slice(2, 96), _data().shuffle(7)):  # 94 examples; the same 96 in another order
        with pytest.raises(ConfigError, match="cut after 3 minibatches of epoch 0.*changed.*restart_epoch=True"):
            fit(_net(), changed)
    with pytest.raises(ConfigError, match="batch_size_per_worker: 8 then, 12 now"):
        fit(_net(), _data(), batch_size_per_worker=12)
    assert newest_checkpoint(str(tmp_path / "ckpt"), "r1").path == cut.path  # nothing trained meanwhile
    fit(_net(after=PER_WORKER - 3), _data())  # the same data: only the minibatches left are trained
