"""On local[2] the workers reach the driver over loopback, share a host and sum through shared memory; with
``port_range`` every listener of the fit (driver relay, progress server, worker 0's store) opens inside it."""

from __future__ import annotations

import socket

import torchspark.spark.barrier as barrier_module
import torchspark.training.driver.context as driver_module
from helpers import mlp_net
from torchspark import datasets, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork


def _free_block(n: int) -> int:
    for first in range(42000, 60000, 97):
        held = []
        try:
            for i in range(n):
                s = socket.socket()
                held.append(s)
                s.bind(("0.0.0.0", first + i))
            return first
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no free block of ports")


def _fit(spark, sc, **mesh) -> SparkNetwork:
    net = mlp_net(12, 16, 3, updater=optim.SGD(lr=0.1))
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8,
        averaging_frequency=2,
        num_workers=2,
        rng_seed=1,
        rdd_training_approach="direct",
        **mesh,
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(datasets.synthetic_classification(64, 12, 3, seed=1).split(8), 2), epochs=1)
    return spark_net


def test_local_workers_use_loopback_and_shared_memory(spark, sc) -> None:
    results = _fit(spark, sc).last_results
    for r in results:
        assert r.network["address"] == "127.0.0.1" and r.network["interface"] == "lo", r.network
        assert r.network["source"] == "route_to_driver"
        assert r.network["shared_memory"] is True  # one host: the exchange goes through /dev/shm


def test_shared_memory_allreduce_off_is_reported(spark, sc) -> None:
    results = _fit(spark, sc, shared_memory_allreduce=False).last_results
    assert [r.network["shared_memory"] for r in results] == [False, False]


def test_every_listener_opens_inside_port_range(spark, sc, monkeypatch) -> None:
    first = _free_block(20)
    opened: list[tuple[str, int]] = []

    def spy(module):
        real = module.listen_in_range

        def record(open_at, port_range, what, port=0):
            got = real(open_at, port_range, what, port)
            opened.append((what, got.address[1] if hasattr(got, "address") else int(got.port)))
            return got

        monkeypatch.setattr(module, "listen_in_range", record)

    spy(driver_module)
    spy(barrier_module)  # the driver's relay (worker 0's store opens in an executor: reported below)
    results = _fit(spark, sc, port_range=(first, first + 19)).last_results
    whats = sorted(w for w, _ in opened)
    assert whats == ["the driver's progress server", "the driver's rendezvous relay"], opened
    assert all(first <= port <= first + 19 for _, port in opened), opened
    store_ports = {int(r.network["store"].rsplit(":", 1)[1]) for r in results}
    assert len(store_ports) == 1 and first <= store_ports.pop() <= first + 19
