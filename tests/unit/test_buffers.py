"""Module buffers (BatchNorm running statistics) are averaged with the parameters and reach the driver."""

from __future__ import annotations

import threading
from functools import partial

import pytest
import torch

from helpers import assert_replicas_identical, batchnorm_net, classification_batches, fit_in_process
from reference_loops import sharing_reference
from torchspark import DataSet, Network, optim
from torchspark.encoding import AdaptiveThreshold, EncoderConfig
from torchspark.errors import DataError, TrainingError
from torchspark.nn import NetworkBlueprint
from torchspark.training import (
    AveragingSettings,
    ThreadGroup,
    WorkerHooks,
    averaging_epoch,
)
from torchspark.training.algorithms.sharing.loop import SharingAlgorithm
from torchspark.training.algorithms.sharing.settings import SharingSettings
from torchspark.training.comm import ThreadCommunicator
from torchspark.training.task import merge_results

_bn_net = partial(batchnorm_net, updater=optim.SGD(lr=0.1))


def _in_threads(work, world: int) -> None:
    """Run ``work(rank)`` on ``world`` threads; re-raise the first failure."""
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            work(rank)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]


def _average(nets: list[Network], shards: list[list[DataSet]], settings: AveragingSettings) -> None:
    """One averaging epoch of ``nets[r]`` on ``shards[r]`` over the in-process communicator."""
    group = ThreadGroup(len(nets), timeout_s=30)

    def work(rank: int) -> None:
        try:
            averaging_epoch(nets[rank], shards[rank], group.communicator(rank), settings, WorkerHooks())
        except BaseException:
            group.abort()
            raise

    _in_threads(work, len(nets))


def test_buffer_views_round_trip_and_validate() -> None:
    net = _bn_net()
    assert net.buffer_size() == 32  # running_mean + running_var; num_batches_tracked is an integer buffer
    flat = torch.arange(32, dtype=torch.float32)
    net.set_buffers(flat)
    torch.testing.assert_close(net.module[1].running_mean, flat[:16])
    torch.testing.assert_close(net.buffers(), flat)
    with pytest.raises(DataError, match="set_buffers needs a 1-D tensor of 32 values, got shape \\(5,\\)"):
        net.set_buffers(torch.zeros(5))
    state = net.buffer_state()
    assert set(state) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    other = _bn_net(seed=1)
    other.load_buffer_state(state)
    torch.testing.assert_close(other.buffers(), flat)


def test_averaging_weights_running_statistics_by_examples_and_returns_them() -> None:
    net = _bn_net()
    a, b = classification_batches(2, seed=1), classification_batches(1, seed=2, size=4)
    results = fit_in_process(
        net, "averaging", {"averaging_frequency": 5, "save_updater": True}, [a, b], timeout_s=300.0, merge=False
    )
    wa, wb = net.copy(), net.copy()
    wa.fit(a)
    wb.fit(b)
    expected = (wa.buffers() * 16 + wb.buffers() * 4) / 20
    assert not torch.allclose(expected, net.buffers()), "the workers' statistics moved"
    merge_results(net, results)
    torch.testing.assert_close(net.buffers(), expected, atol=1e-6, rtol=0)
    assert int(net.module[1].num_batches_tracked) == 2  # worker 0's counter


@pytest.mark.parametrize("save_updater", [True, False])
def test_every_worker_holds_the_example_weighted_mean_after_a_round(save_updater: bool) -> None:
    """Worker 0 fits 2 batches of 8, worker 1 one batch of 4; momentum gives the updater state a length, so the
    buffers sit at a different offset of the all-reduce buffer with and without ``save_updater``."""
    net = _bn_net(updater=optim.SGD(lr=0.1, momentum=0.9))
    a, b = classification_batches(2, seed=1), classification_batches(1, seed=2, size=4)
    wa, wb = net.copy(), net.copy()
    wa.fit(a)
    wb.fit(b)
    expected = (wa.buffers() * 16 + wb.buffers() * 4) / 20  # (32,): running_mean | running_var
    workers = [net.copy(), net.copy()]
    _average(workers, [a, b], AveragingSettings(averaging_frequency=5, save_updater=save_updater))
    assert not torch.allclose(expected[:16], torch.zeros(16)) and not torch.allclose(expected[16:], torch.ones(16))
    for worker in workers:
        torch.testing.assert_close(worker.module[1].running_mean, expected[:16], atol=1e-6, rtol=0)
        torch.testing.assert_close(worker.module[1].running_var, expected[16:], atol=1e-6, rtol=0)
        torch.testing.assert_close(worker.params(), (wa.params() * 16 + wb.params() * 4) / 20, atol=1e-6, rtol=0)
    # integer buffers are not averaged: each worker counts its own minibatches
    assert [int(w.module[1].num_batches_tracked) for w in workers] == [2, 1]


def test_identical_shards_reproduce_single_worker_statistics() -> None:
    """Three workers on the same 6 batches, averaging every 2 (3 rounds, momentum kept), equal one worker.

    Not Adam: the bias of the Linear before BatchNorm has a zero gradient up to rounding noise, which Adam scales
    to steps of ``lr``, so one-ulp differences of the average would show up as differences of ~lr."""
    net = _bn_net(updater=optim.SGD(lr=0.1, momentum=0.9))
    batches = classification_batches(6, seed=7)
    reference = net.copy()
    reference.fit(batches)
    workers = [net.copy() for _ in range(3)]
    _average(workers, [batches] * 3, AveragingSettings(averaging_frequency=2, save_updater=True))
    assert not torch.allclose(reference.buffers(), net.buffers())
    for worker in workers:
        torch.testing.assert_close(worker.buffers(), reference.buffers(), atol=1e-5, rtol=0)
        torch.testing.assert_close(worker.params(), reference.params(), atol=1e-5, rtol=0)
        assert int(worker.module[1].num_batches_tracked) == 6


def test_sharing_finish_averages_the_workers_running_statistics() -> None:
    group = ThreadGroup(2, timeout_s=10)
    algo = SharingAlgorithm(SharingSettings())
    nets = [_bn_net(), _bn_net()]
    nets[0].set_buffers(torch.full((32,), 1.0))
    nets[1].set_buffers(torch.full((32,), 3.0))

    def finish(rank: int) -> None:
        comm = group.communicator(rank)
        algo.finish(algo.start(nets[rank], comm), nets[rank], comm)

    _in_threads(finish, 2)
    assert_replicas_identical(nets, 2)
    for net in nets:
        torch.testing.assert_close(net.buffers(), torch.full((32,), 2.0))


@pytest.mark.parametrize("overlap", [True, False])
def test_sharing_fit_returns_the_mean_of_the_reference_replicas_statistics(overlap: bool) -> None:
    """Each replica's statistics follow its own batches (the reference loop); the fit returns their mean."""
    encoder = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3), shake_frequency=4)
    net = _bn_net(updater=optim.SGD(lr=0.1, momentum=0.9))
    shards = [classification_batches(4, seed=3), classification_batches(4, seed=4)]
    replicas, _ = sharing_reference(net, shards, epochs=2, overlap=overlap, encoder=encoder)
    results = fit_in_process(net, "sharing", SharingSettings(encoder, overlap=overlap).to_dict(), shards, epochs=2)
    assert not torch.allclose(replicas[0].buffers(), replicas[1].buffers())  # the workers' statistics differ
    torch.testing.assert_close(net.buffers(), (replicas[0].buffers() + replicas[1].buffers()) / 2)
    torch.testing.assert_close(net.params(), replicas[0].params())
    assert int(net.module[1].num_batches_tracked) == 8
    assert_replicas_identical(results, 2, net=net)


class _SkewedBuffers(ThreadCommunicator):
    """A broken transport: rank 1's sum of the 32 BatchNorm statistics comes back slightly off."""

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        super().all_reduce_sum(tensor)
        if self.rank == 1 and tensor.numel() == 32:
            tensor += 1e-3
        return tensor


def test_sharing_replica_check_covers_the_averaged_buffers() -> None:
    group = ThreadGroup(2, timeout_s=10)
    algo = SharingAlgorithm(SharingSettings())
    nets = [_bn_net(), _bn_net()]  # plain SGD: no updater state, so the only 32-value all-reduce is the buffers
    errors: list[TrainingError] = []

    def finish(rank: int) -> None:
        comm = _SkewedBuffers(group, rank)
        try:
            algo.finish(algo.start(nets[rank], comm), nets[rank], comm)
        except TrainingError as e:
            errors.append(e)

    _in_threads(finish, 2)
    assert len(errors) == 2 and all("averaged buffers of worker(s) [1]" in str(e) for e in errors), errors


def test_copy_blueprint_and_save_keep_the_statistics(tmp_path) -> None:
    net = _bn_net()
    net.fit(classification_batches(3, seed=9))
    stats = net.buffers()
    assert not torch.allclose(stats[:16], torch.zeros(16)) and int(net.module[1].num_batches_tracked) == 3
    path = net.save(str(tmp_path / "bn"), allow_pickle=True)
    for other in (
        net.copy(),
        NetworkBlueprint.from_bytes(NetworkBlueprint.of(net).to_bytes()).build(),
        Network.load(path, allow_pickle=True),
    ):
        assert torch.equal(other.buffers(), stats)
        assert int(other.module[1].num_batches_tracked) == 3
