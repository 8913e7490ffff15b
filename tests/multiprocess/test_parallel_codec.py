"""The top-k codec on a real gradient-sharing fit: ParallelWrapper, 2 worker processes over gloo."""

from __future__ import annotations

import torch

from helpers import assert_replicas_identical, mlp_net
from torchspark import datasets, optim
from torchspark.encoding import TopKCompressor
from torchspark.parallel import ParallelWrapper


def test_topk_over_processes_keeps_the_replicas_identical_and_learns() -> None:
    data = datasets.synthetic_classification(512, 12, 3, seed=0)
    net = mlp_net(12, 16, 3, updater=optim.Adam(lr=1e-2))
    start = net.params().clone()
    wrapper = ParallelWrapper(
        net, num_workers=2, training_mode="sharing", codec=TopKCompressor(ratio=0.05), rng_seed=0, progress=False
    )
    wrapper.fit(data, epochs=2, batch_size=16)
    assert_replicas_identical(wrapper, 2, net=net)  # every rank's parameter checksum, and the driver's model
    assert net.extra_config["sharing.codec"] == "topk"
    assert net.extra_config["sharing.topology"] == "all_gather"
    assert not torch.equal(net.params(), start)
    assert 0 < net.extra_config["sharing.bytes_sent"] < net.extra_config["sharing.dense_bytes"] / 5
