"""Shuffle between epochs: with ``rng_seed`` every epoch trains the minibatches in a new seeded order -- within
each worker (``shuffle_scope="worker"``, the default) or across workers (``"global"``) --, a pure function of
(seed, epoch), identical on Spark's routes and in ParallelWrapper."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
import torch
from torch import nn

from helpers import indexed_data
from torchspark import Network, optim
from torchspark.errors import ConfigError
from torchspark.parallel import ParallelWrapper
from torchspark.training.assignment import EpochItems, epoch_seed, per_epoch, plan_balanced, split_examples
from torchspark.training.driver.runner import InProcessRunner
from torchspark.training.worker.loop import ItemSource, epoch_order

N, BATCH, WORKERS = 40, 4, 2
#: minibatch ids seen in training, by worker thread (filled by Recorder.forward)
SEEN: dict[str, list[tuple[int, ...]]] = defaultdict(list)


class Recorder(nn.Module):
    """A linear model that records the example ids (feature 0) of every training minibatch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            SEEN[threading.current_thread().name].append(tuple(int(v) for v in x[:, 0].tolist()))
        return self.lin(x * 0.01)


def _epochs(seen: dict[str, list[tuple[int, ...]]], epochs: int) -> list[list[list[tuple[int, ...]]]]:
    """``[worker][epoch]`` -> that worker's minibatches in the epoch (each worker trains a fixed count per epoch)."""
    out = []
    for w in range(WORKERS):
        batches = seen[f"torchspark-worker-{w}"]
        per_epoch_examples = (w + 1) * N // WORKERS - w * N // WORKERS
        epochs_of_w: list[list[tuple[int, ...]]] = [[] for _ in range(epochs)]
        done = 0
        for b in batches:
            epochs_of_w[done // per_epoch_examples].append(b)
            done += len(b)
        out.append(epochs_of_w)
    return out


def _wrapper_run(epochs: int, seed: int | None, scope: str = "global") -> list[list[list[tuple[int, ...]]]]:
    SEEN.clear()
    net = Network(Recorder(), updater=optim.SGD(lr=0.1), seed=0)
    ParallelWrapper(
        net,
        num_workers=WORKERS,
        rng_seed=seed,
        progress=False,
        runner=InProcessRunner(),
        averaging_frequency=2,
        shuffle_scope=scope if seed is not None else "worker",
    ).fit(indexed_data(N), epochs=epochs, batch_size=BATCH)
    return _epochs(SEEN, epochs)


def test_the_worker_scope_keeps_each_workers_examples_and_reorders_them_every_epoch() -> None:
    runs = _wrapper_run(3, seed=5, scope="worker")
    for e in range(3):
        ids = sorted(i for w in range(WORKERS) for b in runs[w][e] for i in b)
        assert ids == list(range(N))
    for w in range(WORKERS):
        assert sorted(runs[w][0]) == sorted(runs[w][1]) == sorted(runs[w][2])  # the same minibatches: no data moves
        assert runs[w][0] != runs[w][1] and runs[w][1] != runs[w][2]  # in a new order every epoch
    plan0 = split_examples([indexed_data(N)], BATCH, WORKERS, 5)
    assert runs[0][0] == [tuple(int(v) for v in b.features[:, 0]) for b in plan0[0]]
    expected = [runs[0][0][k] for k in epoch_order(5, 2, 0, len(runs[0][0]))]
    assert runs[0][2] == expected  # epoch 2's order: a pure function of (seed, epoch, rank)
    assert runs != _wrapper_run(3, seed=5, scope="global")  # the option is honoured


def test_the_global_scope_needs_a_seed_and_the_balanced_split() -> None:
    with pytest.raises(ConfigError, match="shuffle_scope='global'.*rng_seed=None"):
        ParallelWrapper(Network(Recorder(), updater=optim.SGD(lr=0.1)), num_workers=2, shuffle_scope="global")
    from torchspark.training import ParameterAveragingTrainingMaster

    with pytest.raises(ConfigError, match="repartition='never'"):
        ParameterAveragingTrainingMaster(rng_seed=1, shuffle_scope="global", repartition="never")
    with pytest.raises(ConfigError, match="shuffle_scope"):
        ParameterAveragingTrainingMaster(rng_seed=1, shuffle_scope="everywhere")


def test_every_epoch_is_a_new_order_across_workers_covering_every_example_once() -> None:
    runs = _wrapper_run(3, seed=5)
    for e in range(3):
        ids = sorted(i for w in range(WORKERS) for b in runs[w][e] for i in b)
        assert ids == list(range(N))
    worker0 = [sorted(i for b in runs[0][e] for i in b) for e in range(3)]
    assert worker0[0] != worker0[1] or worker0[1] != worker0[2]  # examples move between workers
    assert runs[0][0] != runs[0][1] and runs[0][1] != runs[0][2]
    # epoch 0 is the plan the seed always gave (single-epoch fits are unchanged)
    plan0 = split_examples([indexed_data(N)], BATCH, WORKERS, 5)
    assert runs[0][0] == [tuple(int(v) for v in b.features[:, 0]) for b in plan0[0]]


def test_without_a_seed_every_epoch_repeats_the_data_order() -> None:
    runs = _wrapper_run(2, seed=None)
    assert runs[0][0] == runs[0][1] and runs[1][0] == runs[1][1]


@pytest.mark.parametrize("scope", ["worker", "global"])
def test_the_order_is_a_function_of_seed_and_epoch_so_fits_compose(scope: str) -> None:
    """fit(epochs=2) trains the same sequences as fit(epochs=1) twice (the network's epoch counter numbers them)."""
    together = _wrapper_run(2, seed=9, scope=scope)
    SEEN.clear()
    net = Network(Recorder(), updater=optim.SGD(lr=0.1), seed=0)
    wrapper = ParallelWrapper(
        net,
        num_workers=WORKERS,
        rng_seed=9,
        progress=False,
        runner=InProcessRunner(),
        averaging_frequency=2,
        shuffle_scope=scope,
    )
    wrapper.fit(indexed_data(N), epochs=1, batch_size=BATCH)
    wrapper.fit(indexed_data(N), epochs=1, batch_size=BATCH)
    assert _epochs(SEEN, 2) == together


def test_epoch_seed_and_per_epoch_plans_are_pure() -> None:
    assert epoch_seed(7, 0) == 7
    assert len({epoch_seed(7, e) for e in range(1, 6)}) == 5 and epoch_seed(7, 3) == epoch_seed(7, 3)

    def plan(seed: int | None) -> list[list[int]]:
        p = plan_balanced([N], BATCH, WORKERS, seed)
        return [[int(p.begin[rows[0]]) for rows in p.minibatches(w)] for w in range(WORKERS)]

    assert per_epoch(plan, WORKERS, None, 0, 3) == plan(None)
    three = per_epoch(plan, WORKERS, 7, 0, 3)
    assert [item.epoch for item in three[0]] == [0, 1, 2]
    assert list(three[1][0].items) == plan(7)[1]
    later = per_epoch(plan, WORKERS, 7, 2, 1)  # a fit that starts at epoch 2 (e.g. resumed) plans epoch 2 alike
    assert later[0][0] == three[0][2]
    assert per_epoch(plan, WORKERS, 7, 2, None) == plan(epoch_seed(7, 2))  # the rounds route: plain, one plan
    assert per_epoch(plan, WORKERS, 7, 2, 3, scope="worker") == plan(7)  # the worker scope: the seed's plan, plain


def test_item_source_streams_planned_epochs_and_skips_empty_ones() -> None:
    stream = iter([EpochItems(3, ("a", "b")), EpochItems(3, ("c",)), EpochItems(5, ("d",))])
    source = ItemSource(stream)
    assert source.planned
    assert list(source.epoch(0)) == ["a", "b", "c"]
    assert list(source.epoch(1)) == []  # epoch 4 planned nothing for this worker
    assert list(source.epoch(2)) == ["d"]


def test_replayed_epochs_follow_the_seeded_order() -> None:
    source = ItemSource(iter(["x0", "x1", "x2", "x3", "x4"]))
    order = epoch_order(1, 2, 0, 5)
    assert sorted(order) == list(range(5)) and order == epoch_order(1, 2, 0, 5) != epoch_order(1, 2, 1, 5)
    assert list(source.epoch(0, lambda n: epoch_order(1, 2, 0, n))) == [f"x{k}" for k in order]
    assert list(source.epoch(1)) == ["x0", "x1", "x2", "x3", "x4"]


@pytest.mark.parametrize("seed", [0, 3])
def test_split_examples_epoch_plans_differ(seed: int) -> None:
    plans = [split_examples([indexed_data(N)], BATCH, WORKERS, epoch_seed(seed, e)) for e in range(2)]
    first = [[tuple(b.features[:, 0].tolist()) for b in w] for w in plans[0]]
    second = [[tuple(b.features[:, 0].tolist()) for b in w] for w in plans[1]]
    assert first != second


def test_a_global_scope_fit_of_countless_epochs_is_refused_before_planning_them() -> None:
    from torchspark.spark.connect.feeding import plan_epochs
    from torchspark.training.assignment import MAX_GLOBAL_PLAN_ITEMS

    calls: list[int | None] = []

    def plan(seed: int | None) -> list[list[int]]:
        calls.append(seed)
        return [[0, 1], [2, 3]]

    with pytest.raises(ConfigError, match=r"epochs=100000000 x 4 items.*shuffle_scope='worker'"):
        per_epoch(plan, 2, 7, 0, 10**8, scope="global")
    assert len(calls) == 1  # one epoch planned, then refused (it built all 10**8 and ran out of memory)
    assert len(per_epoch(plan, 2, 7, 0, MAX_GLOBAL_PLAN_ITEMS // 4, scope="worker")) == 2  # one plan: no limit
    with pytest.raises(ConfigError, match="epochs=100000000"):  # the direct route's and Connect's plans
        plan_epochs([40], BATCH, WORKERS, 7, 10**8, 0, scope="global")
    net = Network(Recorder(), updater=optim.SGD(lr=0.1))
    wrapper = ParallelWrapper(net, num_workers=2, rng_seed=7, shuffle_scope="global", batch_size_per_worker=BATCH)
    with pytest.raises(ConfigError, match="epochs=100000000"):
        wrapper.fit([indexed_data(N)], epochs=10**8)
