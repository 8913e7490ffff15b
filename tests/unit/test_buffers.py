"""Module buffers (BatchNorm running statistics) are averaged with the parameters and reach the driver."""

from __future__ import annotations

import threading

import pytest
import torch

from torchspark import DataSet, Network, datasets, optim
from torchspark.errors import DataError
from torchspark.nn import NetworkBlueprint
from torchspark.training import InProcessRunner, ItemSource, ThreadGroup, WorkerTask
from torchspark.training.sharing import SharingAlgorithm, SharingSettings
from torchspark.training.worker import merge_results


def _bn_net(seed: int = 0) -> Network:
    module = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                 torch.nn.Linear(16, 3))
    return Network(module, updater=optim.SGD(lr=0.1), seed=seed)


def _batches(n: int, seed: int, size: int = 8) -> list[DataSet]:
    return datasets.synthetic_classification(n * size, 12, 3, seed=seed).split(size)


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
    a, b = _batches(2, seed=1), _batches(1, seed=2, size=4)
    task = WorkerTask("averaging", {"averaging_frequency": 5, "save_updater": True},
                      NetworkBlueprint.of(net).to_bytes(), epochs=1, prefetch=0)
    results = InProcessRunner().run(task, [ItemSource(a), ItemSource(b)])
    wa, wb = net.copy(), net.copy()
    wa.fit(a)
    wb.fit(b)
    expected = (wa.buffers() * 16 + wb.buffers() * 4) / 20
    assert not torch.allclose(expected, net.buffers()), "the workers' statistics moved"
    merge_results(net, results)
    torch.testing.assert_close(net.buffers(), expected, atol=1e-6, rtol=0)
    assert int(net.module[1].num_batches_tracked) == 2  # worker 0's counter


def test_sharing_finish_averages_the_workers_running_statistics() -> None:
    group = ThreadGroup(2, timeout_s=10)
    algo = SharingAlgorithm(SharingSettings())
    nets = [_bn_net(), _bn_net()]
    nets[0].set_buffers(torch.full((32,), 1.0))
    nets[1].set_buffers(torch.full((32,), 3.0))

    def finish(rank: int) -> None:
        comm = group.communicator(rank)
        algo.finish(algo.start(nets[rank], comm), nets[rank], comm)

    threads = [threading.Thread(target=finish, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for net in nets:
        torch.testing.assert_close(net.buffers(), torch.full((32,), 2.0))


def test_sharing_fit_returns_trained_running_statistics() -> None:
    net = _bn_net()
    settings = SharingSettings(overlap=False)
    task = WorkerTask("sharing", settings.to_dict(), NetworkBlueprint.of(net).to_bytes(), epochs=1, prefetch=0)
    before = net.buffers()
    results = InProcessRunner().run(task, [ItemSource(_batches(3, seed=3)), ItemSource(_batches(3, seed=4))])
    merge_results(net, results)
    assert torch.isfinite(net.buffers()).all() and not torch.allclose(net.buffers(), before)
    assert int(net.module[1].num_batches_tracked) == 3
