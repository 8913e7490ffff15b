"""``fit_paths`` on a Spark Connect session: the client plans the batch files, each worker of one barrier stage reads
its own; the parameters equal ParallelWrapper's on the same files and seed (the classic fit_paths equals it too:
tests/spark/test_parallel_equivalence.py)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from helpers import mlp_net
from torchspark import datasets, optim
from torchspark.data import load_batch, save_batches
from torchspark.encoding import AdaptiveThreshold
from torchspark.errors import ConfigError, DataError
from torchspark.parallel import ParallelWrapper
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

BATCH = 8
SEED = 7

_network = partial(mlp_net, 12, 16, 3, updater=optim.SGD(lr=0.1, momentum=0.9))


@pytest.mark.parametrize(("mode", "rng_seed", "file_size"), [("averaging", SEED, BATCH), ("sharing", None, 12)])
def test_both_masters_give_parallel_wrappers_parameters(connect_spark, tmp_path, mode, rng_seed, file_size) -> None:
    data = datasets.synthetic_classification(100, 12, 3, seed=1)
    paths = save_batches(data.split(file_size), str(tmp_path / "batches"))  # 12-example files: re-batched to 8
    threshold = AdaptiveThreshold(initial=1e-3)
    own = {"averaging_frequency": 3} if mode == "averaging" else {"threshold_algorithm": threshold}
    cls = ParameterAveragingTrainingMaster if mode == "averaging" else SharedTrainingMaster
    master = cls(batch_size_per_worker=BATCH, num_workers=2, rng_seed=rng_seed, **own)

    on_connect = _network()
    spark_net = SparkNetwork(connect_spark, on_connect, master, progress=False)
    spark_net.fit_paths(str(tmp_path / "batches"), epochs=2)

    local = _network()
    wrapper = ParallelWrapper(
        local, num_workers=2, training_mode=mode, rng_seed=rng_seed, threads_per_worker=1, progress=False, **own
    )
    wrapper.fit(paths, epochs=2, batch_size=BATCH)

    assert [r.examples for r in spark_net.last_results] == [r.examples for r in wrapper.last_results] == [100, 100]
    torch.testing.assert_close(on_connect.params(), local.params(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(on_connect.updater_state(), local.updater_state(), atol=1e-6, rtol=1e-6)
    assert (on_connect.iteration, on_connect.epoch) == (local.iteration, 2)


def test_a_loader_counts_on_the_executors_and_trains_the_same(connect_spark, tmp_path) -> None:
    data = datasets.synthetic_classification(60, 12, 3, seed=2)
    save_batches(data.split(10), str(tmp_path / "files"), prefix="part")
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=BATCH, num_workers=2, rng_seed=SEED, averaging_frequency=2
    )
    from_headers, from_loader = _network(), _network()
    SparkNetwork(connect_spark, from_headers, master, progress=False).fit_paths(str(tmp_path / "files"))
    SparkNetwork(connect_spark, from_loader, master, progress=False).fit_paths(
        str(tmp_path / "files"), loader=load_batch
    )
    torch.testing.assert_close(from_loader.params(), from_headers.params(), atol=0, rtol=0)
    assert from_loader.iteration == from_headers.iteration > 0


def test_bad_path_inputs_are_refused(connect_spark, tmp_path) -> None:
    spark_net = SparkNetwork(connect_spark, _network(), SharedTrainingMaster(num_workers=2), progress=False)
    frame = connect_spark.createDataFrame([("a.safetensors",)], "path string")
    with pytest.raises(ConfigError, match="takes a directory, a glob, one file or a list of paths.*got a DataFrame"):
        spark_net.fit_paths(frame)
    with pytest.raises(DataError, match="does not exist"):
        spark_net.fit_paths(str(tmp_path / "missing"))
    (tmp_path / "not-a-batch.safetensors").write_bytes(b"junk")
    with pytest.raises(DataError):
        spark_net.fit_paths([str(tmp_path / "not-a-batch.safetensors")])
