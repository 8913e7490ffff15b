"""A network and data on which flushing denormals is visible: one weight is denormal and never gets a gradient.

Weight ``[0, 0]`` of the first layer connects input feature 0, which is always zero, so its gradient is exactly
zero. Without flushing it stays ``1e-39`` through SGD steps and averaging; with flush-to-zero / denormals-are-zero
any arithmetic on it gives 0.
"""

from __future__ import annotations

import torch

from torchspark import DataSet, Network, optim

DENORMAL = 1e-39


def denormal_net() -> Network:
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    net = Network(module, updater=optim.SGD(lr=0.1), seed=0)
    with torch.no_grad():
        net.module[0].weight[0, 0] = DENORMAL
    assert watched(net) > 0
    return net


def zero_feature_data(n: int = 64, seed: int = 0) -> DataSet:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 4, generator=g)
    x[:, 0] = 0.0
    return DataSet(x, torch.randint(0, 2, (n,), generator=g))


def watched(net: Network) -> float:
    return float(net.module[0].weight.detach()[0, 0])
