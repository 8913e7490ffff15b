"""The training machinery without Spark: in-process runner, averaging loop, devices, addresses, assignment."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from helpers import uniform_batches
from torchspark import DataSet, Network, models, optim
from torchspark.errors import ConfigError, SetupError, WaitTimeout, WorkerError
from torchspark.nn import NetworkBlueprint
from torchspark.training import InProcessRunner, ItemSource, ThreadGroup, WorkerTask, device_for_task
from torchspark.training.assignment import assign_balanced
from torchspark.training.config.mesh import MeshConfig
from torchspark.training.worker.devices import backend_for_device, gpu_addresses
from torchspark.training.worker.prefetch import prefetch


def _task(net: Network, **settings) -> WorkerTask:
    settings = {"averaging_frequency": 3, "save_updater": True, **settings}
    return WorkerTask("averaging", settings, NetworkBlueprint.of(net).to_bytes(), epochs=1, prefetch=2)


def test_weighted_average_of_unequal_rounds_matches_manual_average() -> None:
    """Worker 0 fits 2 batches of 8, worker 1 one batch of 4: the average weights them 16:4."""
    net = Network(models.mlp(64, 8, 10), updater=optim.SGD(lr=0.1), seed=0)
    a, b = uniform_batches(2, size=8, seed=1), uniform_batches(1, size=4, seed=2)
    results = InProcessRunner().run(_task(net, averaging_frequency=5), [ItemSource(a), ItemSource(b)])
    wa, wb = net.copy(), net.copy()
    wa.fit(a)
    wb.fit(b)
    expected = (wa.params() * 16 + wb.params() * 4) / 20
    torch.testing.assert_close(results[0].params, expected, atol=1e-6, rtol=0)
    assert [r.examples for r in results] == [16, 4]


def test_unequal_shards_terminate_and_agree() -> None:
    net = Network(models.mlp(64, 8, 10), updater=optim.SGD(lr=0.1), seed=0)
    shards = [ItemSource(uniform_batches(10)), ItemSource(uniform_batches(1)), ItemSource([])]
    results = InProcessRunner(timeout_s=30).run(_task(net), shards)
    assert [r.iterations for r in results] == [10, 1, 0]
    assert results[0].params is not None and torch.isfinite(results[0].params).all()


def test_worker_failure_aborts_peers_with_traceback() -> None:
    net = Network(models.mlp(64, 8, 10), seed=0)
    bad = DataSet(torch.rand(8, 1, 8, 8), torch.full((8,), 99, dtype=torch.long))
    before = threading.active_count()
    with pytest.raises(WorkerError, match="label index 99") as info:
        shards = [ItemSource(uniform_batches(5)), ItemSource(uniform_batches(2) + [bad])]
        InProcessRunner(timeout_s=30).run(_task(net), shards)
    assert "Traceback" in str(info.value)
    assert threading.active_count() <= before + 1  # prefetch threads are joined


def test_thread_group_timeout_names_the_knob() -> None:
    group = ThreadGroup(2, timeout_s=0.2)
    with pytest.raises(WaitTimeout, match="rendezvous_timeout_s"):
        group.communicator(0).all_reduce_sum(torch.ones(3))


def test_prefetch_reraises_source_errors_and_times_out() -> None:
    def broken():
        yield 1
        raise ValueError("disk on fire")

    it = prefetch(broken(), depth=2, timeout_s=5)
    assert next(it) == 1
    with pytest.raises(ValueError, match="disk on fire"):
        next(it)

    stuck = threading.Event()

    def slow():
        stuck.wait(10)
        yield 1

    # the source comes unstuck 2 s on, long after the 0.2 s timeout: the prefetch thread then ends at once instead
    # of holding the consumer's 5 s join in full
    release = threading.Timer(2.0, stuck.set)
    release.start()
    try:
        with pytest.raises(WaitTimeout, match="data_timeout_s"):
            next(prefetch(slow(), depth=1, timeout_s=0.2))
    finally:
        release.cancel()
        stuck.set()


@pytest.mark.parametrize(
    "addresses, visible, expected",
    [
        (None, None, "cpu"),
        ([], "0,1", "cpu"),
        (["1"], None, "cuda:1"),
        (["3"], "2,3", "cuda:1"),
        (["2"], "2,3", "cuda:0"),
        (["GPU-abc"], "GPU-xyz,GPU-abc", "cuda:1"),
    ],
)
def test_gpu_mapping(addresses, visible, expected) -> None:
    assert device_for_task(addresses, visible, cuda_available=True) == expected
    assert backend_for_device(expected) == ("nccl" if expected.startswith("cuda") else "gloo")


def test_gpu_mapping_errors() -> None:
    with pytest.raises(SetupError, match="no CUDA"):
        device_for_task(["0"], None, cuda_available=False)
    with pytest.raises(SetupError, match="hides it"):
        device_for_task(["5"], "0,1", cuda_available=True)


def test_gpu_addresses_from_resources() -> None:
    class Info:
        addresses = ["0", "1"]

    assert gpu_addresses({"gpu": Info()}) == ["0", "1"]
    assert gpu_addresses({}) == []


def test_network_mask_must_be_a_cidr() -> None:
    with pytest.raises(ConfigError, match="CIDR"):
        MeshConfig(network_mask="not-a-mask")


@pytest.mark.parametrize("total, workers", [(10, 3), (7, 7), (100, 4), (5, 2)])
@pytest.mark.parametrize("seed", [None, 3])
def test_balanced_assignment(total: int, workers: int, seed) -> None:
    plan = assign_balanced(total, workers, seed)
    counts = np.bincount(plan[:, 0], minlength=workers)
    assert counts.max() - counts.min() <= 1 and counts.sum() == total
    assert sorted(plan[:, 1].tolist()) == list(range(total))  # every minibatch exactly once
    if seed is None:
        assert plan[:, 0].tolist() == sorted(plan[:, 0].tolist())  # contiguous blocks in data order


def test_root_cause_prefers_the_failing_worker_over_peers_that_lost_it() -> None:
    from torchspark.training.driver.failures import is_peer_failure, root_cause

    peer = (
        "Traceback (most recent call last):\n  ...\nRuntimeError: [gloo/transport/tcp/pair.cc:537] Read error "
        "[127.0.0.1]:7915: Connection reset by peer"
    )
    cause = "Traceback (most recent call last):\n  ...\ntorchspark.errors.DataError: NaN at example 5"
    assert is_peer_failure(peer) and not is_peer_failure(cause)
    assert root_cause([(1, peer), (0, cause)]) == (0, cause)
    assert root_cause([(1, peer)]) == (1, peer)  # nothing better known: the only error is shown
    assert root_cause([]) is None


@pytest.mark.parametrize(
    "symptom",
    [
        "torchspark.errors.PeerLost: every peer worker left the shared-memory barrier (exited or failed)",
        "torchspark.errors.PeerLost: a peer worker left the shared-memory barrier ([Errno 32] Broken pipe); it has failed",
        "torchspark.errors.WaitTimeout: a peer worker did not reach the shared-memory barrier within "
        "rendezvous_timeout_s=60; it is stuck or gone",
    ],
)
def test_a_peer_leaving_the_shared_memory_barrier_is_a_symptom(symptom: str) -> None:
    from torchspark.training.driver.failures import is_peer_failure, root_cause

    peer = f"Traceback (most recent call last):\n  ...\n{symptom}"
    cause = "Traceback (most recent call last):\n  ...\ntorchspark.errors.DataError: NaN at example 4"
    assert is_peer_failure(peer)
    assert root_cause([(0, peer), (1, cause)]) == (1, cause)


def test_item_source_decodes_serialized_batches_once_and_replays_them() -> None:
    from torchspark.data import dataset_to_bytes

    batches = uniform_batches(3)
    source = ItemSource(iter([dataset_to_bytes(b) for b in batches]))
    first = list(source.epoch(0))
    assert all(isinstance(b, DataSet) for b in first)
    for got, want in zip(first, batches):
        assert torch.equal(got.features, want.features) and torch.equal(got.labels, want.labels)
    again = source.epoch(1)
    assert isinstance(again, list) and [id(b) for b in again] == [id(b) for b in first], "decoded once, kept"
    paths = ItemSource(iter(["/data/a.safetensors", "/data/b.safetensors"]))
    assert list(paths.epoch(0)) == paths.epoch(1) == ["/data/a.safetensors", "/data/b.safetensors"]


def test_ready_minibatches_skip_the_prefetch_thread(monkeypatch) -> None:
    """Batches already in memory go straight to the loop; anything to load still goes through the prefetcher."""
    import torchspark.training.worker.loop as worker_mod
    from torchspark.data import dataset_to_bytes

    calls: list[int] = []

    def spy(items, depth, timeout_s, transform=None):
        calls.append(depth)
        return prefetch(items, depth, timeout_s, transform)

    monkeypatch.setattr(worker_mod, "prefetch", spy)
    net = Network(models.mlp(64, 8, 10), updater=optim.SGD(lr=0.1), seed=0)
    InProcessRunner().run(_task(net), [ItemSource(uniform_batches(4)), ItemSource(uniform_batches(4))])
    assert calls == []
    serialized = [ItemSource(iter([dataset_to_bytes(b) for b in uniform_batches(4)])) for _ in range(2)]
    task = WorkerTask(
        "averaging",
        {"averaging_frequency": 2, "save_updater": True},
        NetworkBlueprint.of(net).to_bytes(),
        epochs=2,
        prefetch=2,
    )
    InProcessRunner().run(task, serialized)
    assert calls == [2, 2], "first epoch decodes on the prefetch thread; the second replays decoded batches"


def test_every_context_offers_what_run_context_declares() -> None:
    from torchspark.training.driver.fit import FitContext
    from torchspark.training.driver.runner import NULL_CONTEXT, RunContext
    from torchspark.training.hooks import NullRecorder

    declared = {n for n in vars(RunContext) if not n.startswith("_")} | set(RunContext.__annotations__)
    assert {
        "network",
        "recorder",
        "description",
        "attempt",
        "progress_address",
        "reported_errors",
        "notify",
        "stalled",
    } <= declared
    fit_context = FitContext(Network(models.mlp(4, 8, 3), seed=0), NullRecorder(), "fit")
    for context in (fit_context, NULL_CONTEXT):
        missing = [n for n in declared if not hasattr(type(context), n) and n not in vars(context)]
        assert missing == [], f"{type(context).__name__} lacks {missing}"


def test_a_runner_on_its_own_runs_with_the_null_context() -> None:
    from torchspark.training.driver.runner import NULL_CONTEXT

    assert NULL_CONTEXT.progress_address() is None and NULL_CONTEXT.reported_errors() == []
    assert NULL_CONTEXT.stalled(2, 1.0) is None and NULL_CONTEXT.attempt == 0
    with NULL_CONTEXT.recorder.phase("fit"):
        pass
    with pytest.raises(ConfigError, match="run it through run_fit"):
        NULL_CONTEXT.network  # noqa: B018 - the rounds route trains the driver's network: it needs run_fit's
    net = Network(models.mlp(64, 8, 10), updater=optim.SGD(lr=0.1), seed=0)
    results = InProcessRunner(timeout_s=30).run(
        _task(net), [ItemSource(uniform_batches(3)), ItemSource(uniform_batches(3))]
    )
    assert [r.rank for r in results] == [0, 1]
