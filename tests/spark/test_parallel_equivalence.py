"""ParallelWrapper and SparkNetwork give the same parameters for the same seed, data order and settings.

Both run the same worker loop (:func:`torchspark.training.worker.loop.run_worker`) on the same per-worker minibatch
sequences (:func:`torchspark.training.assignment.split_for_workers`); only the transport differs (Spark barrier
stage vs spawned processes). One torch thread per worker on both sides (Spark: ``spark.task.cpus=1``), so even the
floating-point reductions match.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from helpers import mlp_net
from torchspark import datasets, optim
from torchspark.data import save_batches
from torchspark.encoding import AdaptiveThreshold
from torchspark.parallel import ParallelWrapper
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

BATCH = 8
SEED = 7


# momentum: the updater state must match too, not only the parameters
_network = partial(mlp_net, 12, 16, 3, updater=optim.SGD(lr=0.1, momentum=0.9))


@pytest.mark.parametrize(
    ("mode", "source"), [("averaging", "dataset"), ("sharing", "dataset"), ("averaging", "batch_files")]
)
def test_parallel_wrapper_matches_spark(spark, sc, tmp_path, mode: str, source: str) -> None:
    data = datasets.synthetic_classification(100, 12, 3, seed=1)  # 12 full minibatches + one of 4 examples
    paths = save_batches(data.split(BATCH), str(tmp_path)) if source == "batch_files" else None
    threshold = AdaptiveThreshold(initial=1e-3)
    if mode == "averaging":
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=BATCH, averaging_frequency=3, num_workers=2, rng_seed=SEED
        )
    else:
        master = SharedTrainingMaster(
            batch_size_per_worker=BATCH, num_workers=2, rng_seed=SEED, threshold_algorithm=threshold
        )

    on_spark = _network()
    spark_net = SparkNetwork(spark, on_spark, master, progress=False)
    if paths is None:
        spark_net.fit(sc.parallelize(data.split(BATCH), 3), epochs=2)
        spark_net.delete_temp_files()
    else:
        spark_net.fit_paths(paths, epochs=2)

    local = _network()
    own = {"averaging_frequency": 3} if mode == "averaging" else {"threshold_algorithm": threshold}
    wrapper = ParallelWrapper(
        local, num_workers=2, training_mode=mode, rng_seed=SEED, threads_per_worker=1, progress=False, **own
    )
    wrapper.fit(data if paths is None else paths, epochs=2, batch_size=BATCH)

    assert [r.examples for r in wrapper.last_results] == [r.examples for r in spark_net.last_results]
    torch.testing.assert_close(local.params(), on_spark.params(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(local.updater_state(), on_spark.updater_state(), atol=1e-6, rtol=1e-6)
    assert local.iteration == on_spark.iteration and local.epoch == on_spark.epoch == 2
    assert sorted(local.extra_state) == sorted(on_spark.extra_state)
    for key, value in on_spark.extra_state.items():
        torch.testing.assert_close(local.extra_state[key], value, atol=1e-6, rtol=1e-6)
    assert wrapper.score == pytest.approx(spark_net.score, rel=1e-5)
