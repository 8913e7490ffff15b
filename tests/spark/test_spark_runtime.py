"""How training stages run on Spark: rendezvous routes, warm Python workers, shared-memory all-reduce, reuse of
the prepared data across fits."""

from __future__ import annotations

import sys

import pytest
import torch

from helpers import mlp_net, uniform_data
from torchspark import Network, models, optim
from torchspark.errors import ConfigError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork
from torchspark.spark.preparation import _first_and_drain, first_item


def _fit(spark, rdd, **master_kw) -> tuple[SparkNetwork, Network]:
    net = mlp_net(64, 16, 10, updater=optim.Adam(lr=1e-2), seed=1)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8, averaging_frequency=3, num_workers=2, **master_kw
    )
    snet = SparkNetwork(spark, net, master, progress=False)
    snet.fit(rdd, epochs=2)
    return snet, net


def test_both_rendezvous_routes_and_both_transports_train_to_the_same_parameters(spark, sc) -> None:
    rdd = sc.parallelize(uniform_data(128, shape=(64,)).split(16), 2)
    results = {}
    for via, shm in [("driver", True), ("barrier", True), ("driver", False)]:
        snet, net = _fit(spark, rdd, rendezvous_via=via, shared_memory_allreduce=shm)
        results[(via, shm)] = net.params()
        snet.delete_temp_files()
    reference = results[("driver", True)]
    assert not torch.equal(reference, Network(models.mlp(64, 16, 10), seed=1).params()), "training changed nothing"
    for key, params in results.items():
        torch.testing.assert_close(params, reference, atol=1e-6, rtol=0, msg=f"route {key} differs")


def test_barrier_rendezvous_gives_up_after_rendezvous_timeout_s_not_the_sessions_limit(sc) -> None:
    """Worker 0 rendezvous through Spark's allGather (``rendezvous_via="barrier"``) while worker 1 never arrives: the
    wait ends after the master's ``rendezvous_timeout_s`` (2 s), not the session's far longer
    ``spark.barrier.sync.timeout``, and the driver shows worker 0's WaitTimeout."""
    from torchspark.errors import WorkerError
    from torchspark.spark.jobs import run_barrier_stage

    assert float(sc.getConf().get("spark.barrier.sync.timeout")) >= 60, "the session must not end the wait itself"

    def stage(items):
        import time

        from pyspark import BarrierTaskContext

        from torchspark.spark.barrier import rendezvous
        from torchspark.training.config.mesh import MeshConfig

        ctx = BarrierTaskContext.get()
        if ctx.partitionId() == 1:  # the peer that never arrives; Spark kills it when worker 0 fails the stage
            time.sleep(60)
            return
        rendezvous(ctx, MeshConfig(rendezvous_timeout_s=2), "cpu", relay_address=None)
        yield "rendezvous completed"

    with pytest.raises(WorkerError) as info:
        run_barrier_stage(sc, sc.parallelize(range(2), 2), stage, "a peer that never arrives")
    message = str(info.value)
    assert (
        "WaitTimeout: worker 0 of 2 in Spark's barrier allGather did not return within rendezvous_timeout_s=2 s"
        in message
    ), message
    assert sc.parallelize(range(4), 2).sum() == 6  # the session still works


def test_rendezvous_options_are_validated_and_round_trip() -> None:
    master = ParameterAveragingTrainingMaster(rendezvous_via="barrier", shared_memory_allreduce=False)
    assert ParameterAveragingTrainingMaster.from_json(master.to_json()) == master
    with pytest.raises(ConfigError, match=r"rendezvous_via must be one of \['driver', 'barrier'\], got 'mpi'"):
        ParameterAveragingTrainingMaster(rendezvous_via="mpi")
    with pytest.raises(ConfigError, match="shared_memory_allreduce must be True or False, got 'yes'"):
        ParameterAveragingTrainingMaster(shared_memory_allreduce="yes")


def test_a_bare_spark_context_trains_like_the_session(spark, sc) -> None:
    rdd = sc.parallelize(uniform_data(96, seed=5, shape=(64,)).split(12), 2)
    params = {}
    for name, handle in (("SparkContext", sc), ("SparkSession", spark)):
        snet, net = _fit(handle, rdd)
        assert snet.sc is sc
        assert sorted(r.examples for r in snet.last_results) == [96, 96]  # 48 examples per worker, 2 epochs
        snet.delete_temp_files()
        params[name] = net.params()
    assert not torch.equal(params["SparkContext"], Network(models.mlp(64, 16, 10), seed=1).params())
    torch.testing.assert_close(params["SparkContext"], params["SparkSession"], atol=1e-6, rtol=0)


def test_python_workers_fork_from_the_preloading_daemon(sc) -> None:
    """Workers fork from torchspark's daemon, which imported torch (and the numba kernel of the codec) and froze
    those objects out of the garbage collector's reach: PySpark's daemon collects after every task, and without the
    freeze each collection walks torch's few hundred thousand objects (~0.1 CPU-s per task)."""

    def probe(_: object) -> tuple[str, bool, bool, bool, int]:
        import gc

        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        tracked = {id(o) for o in gc.get_objects()}  # every generation; frozen objects are in none of them
        kernel = sys.modules.get("torchspark.encoding._onepass_kernel")
        return (
            spec.name if spec is not None else "",
            "torch" in sys.modules,
            id(vars(sys.modules["torch"])) not in tracked,  # imported before the fork, then frozen
            kernel is not None and id(vars(kernel)) not in tracked,  # the same for the optional numba kernel
            gc.get_freeze_count(),
        )

    found = sc.parallelize(range(2), 2).map(probe).collect()
    assert {f[:4] for f in found} == {("torchspark.spark._daemon", True, True, True)}, found
    assert all(f[4] > 50_000 for f in found), found  # torch alone is ~300k objects


def test_direct_route_reuses_its_prepared_rdd_and_releases_it(spark, sc) -> None:
    def persisted(rdd) -> bool:
        return bool(sc._jsc.getPersistentRDDs().containsKey(rdd.id()))

    rdd = sc.parallelize(uniform_data(96, seed=2, shape=(64,)).split(12), 3)
    snet, net = _fit(spark, rdd, rdd_training_approach="direct")
    (first,) = snet.preparation.persisted.values()
    assert persisted(first)
    snet.fit(rdd, epochs=1)
    assert list(snet.preparation.persisted.values()) == [first], "a second fit of the same RDD reuses the prepared data"
    other = sc.parallelize(uniform_data(64, seed=3, shape=(64,)).split(8), 2)
    snet.fit(other, epochs=1)
    (second,) = snet.preparation.persisted.values()
    assert second is not first and persisted(second)
    assert not persisted(first), "only the latest data stays persisted"
    snet.delete_temp_files()
    assert not persisted(second) and snet.preparation.persisted == {}


def test_first_item_skips_empty_partitions_and_reads_partitions_to_the_end(sc) -> None:
    rdd = sc.parallelize([[], ["a", "b", "c"], ["d"]], 3).flatMap(lambda x: x)
    assert first_item(sc, rdd) == "a"
    assert first_item(sc, sc.parallelize([], 2)) is None
    consumed: list[int] = []

    def items():
        for i in range(5):
            consumed.append(i)
            yield i

    assert _first_and_drain(items()) == [0]
    assert consumed == [0, 1, 2, 3, 4]


def test_channels_last_network_trains_on_spark_like_contiguous(spark, sc) -> None:
    from torchspark import datasets

    data = datasets.synthetic_images(96, 1, 12, 12, n_classes=10, seed=4)
    rdd = sc.parallelize(data.split(12), 2)
    results = []
    for fmt in ("contiguous", "channels_last"):
        net = Network(models.lenet(1, 10, 12, 12), updater=optim.Adam(lr=1e-3), seed=0, memory_format=fmt)
        master = ParameterAveragingTrainingMaster(batch_size_per_worker=12, averaging_frequency=2, num_workers=2)
        snet = SparkNetwork(spark, net, master, progress=False)
        snet.fit(rdd, epochs=2)
        snet.delete_temp_files()
        assert net.memory_format == fmt
        results.append([p.detach().clone() for p in net.module.parameters()])
    start = Network(models.lenet(1, 10, 12, 12), seed=0).module.parameters()
    assert max(float((a - s).detach().abs().max()) for a, s in zip(results[0], start)) > 1e-3
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=0)


@pytest.mark.parametrize("via", ["torch", "spark"])
def test_flush_denormal_reaches_the_spark_workers(spark, sc, via: str) -> None:
    """A denormal weight without gradient is flushed to 0 by the workers by default, kept when switched off."""
    from denormal_case import DENORMAL, denormal_net, watched, zero_feature_data

    rdd = sc.parallelize(zero_feature_data(64).split(8), 2)
    got = {}
    for flush in (True, False):
        net = denormal_net()
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=8, averaging_frequency=2, num_workers=2, averaging_via=via, flush_denormal=flush
        )
        snet = SparkNetwork(spark, net, master, progress=False)
        snet.fit(rdd)
        snet.delete_temp_files()
        got[flush] = watched(net)
    assert got[True] == 0.0
    assert got[False] == pytest.approx(DENORMAL, rel=1e-3)
