"""The averaging round's buffer (``RoundBuffer``) packs and unpacks exactly as the general rule
(``pack_weighted`` / ``apply_weighted_mean``), on its cached views too, and follows the network when the updater's
tensors change."""

from __future__ import annotations

import torch

from helpers import mlp_net
from torchspark import datasets, optim
from torchspark.training.algorithms.averaging import RoundBuffer, apply_weighted_mean, pack_weighted
from torchspark.training.comm import SoloCommunicator


def _trained(save_updater: bool = True):
    net = mlp_net(8, 16, 3, updater=optim.Adam(lr=1e-2))
    for batch in datasets.synthetic_classification(48, 8, 3, seed=0).split(16):
        net.train_step(batch)
    return net


def test_pack_and_unpack_equal_the_general_rule_bit_for_bit():
    net, twin = _trained(), _trained()
    buf = RoundBuffer(net, True, SoloCommunicator())
    packed = buf.pack(3.0, 0.5, 1.0).clone()
    assert torch.equal(packed[:-3], pack_weighted(twin, 3.0, True))
    assert packed[-3:].tolist() == [3.0, 0.5, 1.0]
    total = packed * 1.7  # any sum: unpack divides it back into the live tensors
    buf.unpack(total, 5.1)
    apply_weighted_mean(twin, total, 5.1, True)
    assert torch.equal(net.params(), twin.params())
    assert torch.equal(net.updater_state(), twin.updater_state())


def test_the_cached_views_follow_new_updater_tensors():
    net = _trained()
    buf = RoundBuffer(net, True, SoloCommunicator())
    buf.pack(1.0, 0.0, 1.0)
    net.optimizer.state.clear()  # the optimizer rebuilds its state: other tensors than the cached views
    batch = datasets.synthetic_classification(16, 8, 3, seed=1)
    net.train_step(batch)
    packed = buf.pack(2.0, 0.0, 1.0).clone()
    assert torch.equal(packed[:-3], pack_weighted(net, 2.0, True))
