"""The masters' options without Spark: each works (and changes what happens) or is refused at construction;
and the replicas' checksums are measured on every rank."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from helpers import assert_replicas_identical, classification_batches, fit_in_process
from torchspark import Network, datasets, models, optim
from torchspark.errors import ConfigError, WaitTimeout
from torchspark.nn import NetworkBlueprint
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster
from torchspark.spark.data import _RoundRobinKeys, group_paths, seeded_order
from torchspark.stats import DRIVER_ID, StatsCollector
from torchspark.training import InProcessRunner, WorkerTask
from torchspark.training.algorithms.sharing.settings import SharingSettings
from torchspark.training.driver.stats import build_training_stats
from torchspark.training.task import WorkerResult, param_checksum
from torchspark.training.worker.prefetch import prefetch

MASTERS = [ParameterAveragingTrainingMaster, SharedTrainingMaster]


# ------------------------------------------------------------------ refused at construction
@pytest.mark.parametrize("master", MASTERS)
@pytest.mark.parametrize("level", ["MEMORY", "memory_only", "", None, 3])
def test_unknown_storage_level_is_refused_at_construction(master, level) -> None:
    with pytest.raises(ConfigError, match=r"storage_level must be one of .*MEMORY_AND_DISK"):
        master(storage_level=level)


@pytest.mark.parametrize("master", MASTERS)
def test_every_storage_level_name_is_accepted(master) -> None:
    from torchspark.training.config.masters import STORAGE_LEVELS

    for level in STORAGE_LEVELS:
        assert master(storage_level=level).storage_level == level


def test_workers_per_node_with_num_workers_is_refused() -> None:
    with pytest.raises(ConfigError, match="set num_workers=4 or workers_per_node=2"):
        SharedTrainingMaster(num_workers=4, workers_per_node=2)
    assert SharedTrainingMaster(workers_per_node=2).resolve_num_workers(8, executors=3) == 6
    assert SharedTrainingMaster(num_workers=4).resolve_num_workers(8, executors=3) == 4


# ------------------------------------------------------------------ data_timeout_s without prefetch
def test_prefetch_zero_loads_on_demand_and_still_times_out() -> None:
    produced: list[int] = []

    def counting():
        for i in range(5):
            produced.append(i)
            yield i

    it = prefetch(counting(), depth=0, timeout_s=5)
    assert next(it) == 0
    time.sleep(0.2)  # a read-ahead would have produced more by now
    assert produced == [0]  # no read-ahead: the next item is loaded only when asked for
    assert list(it) == [1, 2, 3, 4]

    def broken():
        yield 1
        raise ValueError("disk on fire")

    it = prefetch(broken(), depth=0, timeout_s=5)
    assert next(it) == 1
    with pytest.raises(ValueError, match="disk on fire"):
        next(it)

    release = threading.Event()

    def stuck():
        yield 1
        release.wait(30)
        yield 2

    it = prefetch(stuck(), depth=0, timeout_s=0.3)
    assert next(it) == 1
    with pytest.raises(WaitTimeout, match=r"data_timeout_s=0\.3"):
        next(it)
    release.set()


def test_worker_without_prefetch_fails_on_a_stuck_source_naming_data_timeout_s() -> None:
    """A worker with ``prefetch=0`` whose data source blocks longer than ``data_timeout_s`` fails with the knob's
    name instead of hanging (the option used to be dropped without prefetch)."""
    release = threading.Event()
    net = Network(models.mlp(12, 8, 3), updater=optim.SGD(lr=0.1), seed=0)
    batches = datasets.synthetic_classification(16, 12, 3, seed=0).split(8)

    class Stuck:
        def epoch(self, index: int):
            yield batches[0]  # a generator, not a ready list: the worker goes through the loader
            release.wait(60)
            yield batches[1]

    task = WorkerTask(
        "averaging",
        {"averaging_frequency": 1, "save_updater": True},
        NetworkBlueprint.of(net).to_bytes(),
        prefetch=0,
        data_timeout_s=1.0,
    )
    try:
        with pytest.raises(WaitTimeout, match=r"data_timeout_s=1\.0"):
            InProcessRunner(timeout_s=30).run(task, [Stuck()])
    finally:
        release.set()


# ------------------------------------------------------------------ rng_seed with kept partitions / spark_default
def test_seeded_order_is_a_fixed_permutation_per_seed_and_stream() -> None:
    assert seeded_order(20, 1, 0) == seeded_order(20, 1, 0)
    assert sorted(seeded_order(20, 1, 0)) == list(range(20))
    assert seeded_order(20, 1, 0) != seeded_order(20, 2, 0)
    assert seeded_order(20, 1, 0) != seeded_order(20, 1, 1)


def test_group_paths_by_partition_shuffles_each_workers_own_paths_with_a_seed() -> None:
    paths = [(p, f"part{p}-{i}") for p in range(2) for i in range(12)]
    plain = group_paths(paths, 2, None, by_partition=True)
    assert plain == [[f"part{p}-{i}" for i in range(12)] for p in range(2)]
    seeded = group_paths(paths, 2, 5, by_partition=True)
    assert seeded == group_paths(paths, 2, 5, by_partition=True)  # the same every run
    assert [sorted(g) for g in seeded] == [sorted(g) for g in plain]  # each worker keeps its own partition
    assert seeded != plain and seeded != group_paths(paths, 2, 6, by_partition=True)


def test_round_robin_deal_with_a_seed_keeps_the_shares_and_shuffles_the_order() -> None:
    items = list(range(12))

    def deal(seed):
        keyed = sorted(_RoundRobinKeys(3, seed)(0, items), key=lambda kv: kv[0])  # what the shuffle-sort does
        groups: dict[int, list[int]] = {}
        for key, item in keyed:
            groups.setdefault(key if seed is None else key[0], []).append(item)
        return [groups[w] for w in range(3)]

    plain, seeded = deal(None), deal(7)
    assert [len(g) for g in seeded] == [len(g) for g in plain] == [4, 4, 4]
    assert seeded == deal(7) and seeded != plain and seeded != deal(8)
    assert sorted(x for g in seeded for x in g) == items


# ------------------------------------------------------------------ replicas: measured checksums
@pytest.mark.parametrize("mode", ["averaging", "sharing"])
def test_every_rank_reports_its_checksum_and_they_match_the_merged_network(mode) -> None:
    net = Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.1, momentum=0.9), seed=0)
    before = param_checksum(net)
    settings = {"averaging_frequency": 2, "save_updater": True} if mode == "averaging" else SharingSettings().to_dict()
    results = fit_in_process(
        net, mode, settings, [classification_batches(5, 1), classification_batches(5, 2)], timeout_s=60.0
    )
    checksums = [r.param_checksum for r in results]
    assert None not in checksums and checksums[0] == checksums[1]
    assert checksums[0] == param_checksum(net) != before  # the driver holds the same, trained replica
    stats = build_training_stats(StatsCollector(DRIVER_ID), results, 1).summary()
    assert stats["param_checksums"] == {"0": checksums[0], "1": checksums[1]}
    assert stats["replicas_identical"] is True


def test_differing_replicas_are_reported_as_such() -> None:
    a = Network(models.mlp(12, 16, 3), seed=0)
    b = a.copy()
    b.apply_update(torch.full((b.num_params(),), 1e-7))  # one ulp-sized step is enough
    assert param_checksum(a) != param_checksum(b) and param_checksum(a) == param_checksum(a.copy())
    results = [
        WorkerResult(rank=r, examples=8, iterations=1, score=0.5, param_checksum=param_checksum(n))
        for r, n in enumerate([a, b])
    ]
    summary = build_training_stats(StatsCollector(DRIVER_ID), results, 1).summary()
    assert summary["replicas_identical"] is False
    assert summary["param_checksums"]["0"] != summary["param_checksums"]["1"]
    # a route without replicas (averaging_via="spark") reports no checksums rather than a guess
    bare = [WorkerResult(rank=0, examples=8, iterations=1, score=0.5)]
    assert "param_checksums" not in build_training_stats(StatsCollector(DRIVER_ID), bare, 1).summary()
    # the tests' assertion sees each of these: differing replicas, a missing checksum, a missing rank
    same = [
        WorkerResult(rank=r, examples=8, iterations=1, score=0.5, param_checksum=param_checksum(a)) for r in range(2)
    ]
    assert assert_replicas_identical(same, 2, net=a) == param_checksum(a)
    for wrong, workers, net in (
        (results, 2, None),
        (summary, 2, None),
        (bare, 1, None),
        (same, 3, None),
        (same, 2, b),
        ([a, b], 2, None),
    ):
        with pytest.raises(AssertionError):
            assert_replicas_identical(wrong, workers, net=net)


def test_a_source_that_bounds_its_own_waits_skips_the_loader(monkeypatch) -> None:
    """The parent-fed queue of ParallelWrapper times out by itself: no loader thread per step there; any other
    source with ``prefetch=0`` goes through the loader that applies ``data_timeout_s``."""
    import torchspark.training.worker.loop as worker_mod

    calls: list[int] = []

    def spy(items, depth, timeout_s, transform=None):
        calls.append(depth)
        return prefetch(items, depth, timeout_s, transform)

    monkeypatch.setattr(worker_mod, "prefetch", spy)
    net = Network(models.mlp(12, 8, 3), updater=optim.SGD(lr=0.1), seed=0)
    batches = datasets.synthetic_classification(32, 12, 3, seed=0).split(8)

    class Source:
        def __init__(self, bounded: bool) -> None:
            self.bounded_wait = bounded

        def epoch(self, index: int):
            return iter(batches)

    task = WorkerTask(
        "averaging", {"averaging_frequency": 2, "save_updater": True}, NetworkBlueprint.of(net).to_bytes(), prefetch=0
    )
    InProcessRunner().run(task, [Source(True)])
    assert calls == []
    InProcessRunner().run(task, [Source(False)])
    assert calls == [0]
