"""The zoo's real-size architectures (``vgg`` with batch norm, ``text_transformer``) train on Spark with both masters
and give what ParallelWrapper gives for the same seed and data.

One short fit each on tiny data (2 workers x 2 steps), on narrow variants of the same code: what is checked is that
batch norm's buffers, the attention's packed projections and integer token features go through the Spark route and
the local-process route alike. The default sizes (13.5 M and 6.2 M parameters) take 15-100 s per Spark fit on 2
cores, too long for this suite; they run in ``benchmarks/bench_throughput.py --models vgg,transformer`` (which
measures both masters on Spark and ParallelWrapper) and learn in ``bench_cluster.py --workload transformer``."""

from __future__ import annotations

import pytest
import torch

from torchspark import Network, datasets, models, optim
from torchspark.encoding import AdaptiveThreshold
from torchspark.parallel import ParallelWrapper
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

BATCH = 4
SEED = 11


def _network(name: str) -> Network:
    if name == "vgg":
        module = models.vgg(3, 10, widths=[8, 16, 32], hidden=32)
    else:
        module = models.text_transformer(2000, 4, max_len=32, d_model=32, n_heads=4, d_ff=64)
    return Network(module, updater=optim.Adam(lr=1e-3), seed=0)


def _data(name: str):
    if name == "vgg":
        return datasets.synthetic_images(16, 3, 32, 32, n_classes=10, seed=2)
    return datasets.synthetic_keywords(16, seq_len=24, vocab_size=2000, seed=2)


@pytest.mark.parametrize("mode", ["averaging", "sharing"])
@pytest.mark.parametrize("name", ["vgg", "text_transformer"])
def test_real_size_network_on_spark_equals_parallel_wrapper(spark, sc, name: str, mode: str) -> None:
    data = _data(name)
    threshold = AdaptiveThreshold(initial=1e-3)
    own = {"averaging_frequency": 2} if mode == "averaging" else {"threshold_algorithm": threshold}
    master_class = ParameterAveragingTrainingMaster if mode == "averaging" else SharedTrainingMaster
    master = master_class(batch_size_per_worker=BATCH, num_workers=2, rng_seed=SEED, **own)

    on_spark = _network(name)
    start, start_buffers = on_spark.params().clone(), on_spark.buffers().clone()
    spark_net = SparkNetwork(spark, on_spark, master, progress=False)
    spark_net.fit(sc.parallelize(data.split(BATCH), 2), epochs=1)
    spark_net.delete_temp_files()

    local = _network(name)
    wrapper = ParallelWrapper(
        local, num_workers=2, training_mode=mode, rng_seed=SEED, threads_per_worker=1, progress=False, **own
    )
    wrapper.fit(data, epochs=1, batch_size=BATCH)

    assert [r.examples for r in spark_net.last_results] == [8, 8]
    assert not torch.equal(on_spark.params(), start)  # it trained
    torch.testing.assert_close(local.params(), on_spark.params(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(local.updater_state(), on_spark.updater_state(), atol=1e-6, rtol=1e-6)
    if name == "vgg":  # batch norm's running statistics: moved by the fit, the same on both routes
        assert not torch.equal(on_spark.buffers(), start_buffers)
        torch.testing.assert_close(local.buffers(), on_spark.buffers(), atol=1e-6, rtol=1e-6)
    assert wrapper.score == pytest.approx(spark_net.score, rel=1e-5)
