"""ParallelWrapper's 2 worker processes train at the network's precision (bf16 here), with both masters: the same
result as the single-process reference (averaging) or the in-process runner (sharing), not the fp32 one."""

from __future__ import annotations

from functools import partial

import torch

from helpers import assert_replicas_identical, mlp_net
from reference_loops import averaging_reference
from torchspark import datasets, optim
from torchspark.parallel import ParallelWrapper
from torchspark.training import InProcessRunner
from torchspark.training.assignment import split_examples

BATCH = 8
DATA = datasets.synthetic_classification(64, 12, 3, seed=5)  # 4 minibatches per worker and epoch


def test_averaging_worker_processes_train_in_bf16_as_the_reference_does() -> None:
    network = partial(mlp_net, 12, 16, 3, updater=optim.Adam(lr=1e-2))
    net = network(precision="bf16")
    shards = split_examples([DATA], BATCH, 2, None)
    expected = averaging_reference(net, shards, epochs=2, frequency=2, save_updater=True)
    fp32 = averaging_reference(network(), shards, epochs=2, frequency=2, save_updater=True)
    ParallelWrapper(
        net, num_workers=2, training_mode="averaging", averaging_frequency=2, threads_per_worker=1, progress=False
    ).fit(DATA, epochs=2, batch_size=BATCH)
    torch.testing.assert_close(net.params(), expected.params(), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(net.params(), fp32.params(), atol=1e-4)
    assert net.precision == "bf16"


def test_sharing_worker_processes_train_in_bf16_as_worker_threads_do() -> None:
    network = partial(mlp_net, 12, 16, 3, updater=optim.SGD(lr=0.1, momentum=0.9))
    results = {}
    for precision, runner in (("bf16", None), ("bf16", InProcessRunner(timeout_s=60)), ("fp32", None)):
        net = network(precision=precision)
        wrapper = ParallelWrapper(
            net, num_workers=2, training_mode="sharing", threads_per_worker=1, progress=False, runner=runner, rng_seed=0
        )
        wrapper.fit(DATA, epochs=2, batch_size=BATCH)
        if runner is None:
            assert_replicas_identical(wrapper, 2, net=net)
        results[precision, runner is None] = net.params()
    assert torch.equal(results["bf16", True], results["bf16", False])
    assert not torch.allclose(results["bf16", True], results["fp32", True], atol=1e-5)
