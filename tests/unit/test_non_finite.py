"""NaN end to end on one process: ``Network.output`` refuses or nulls examples with NaN/inf features, and a
training step whose gradient is not finite (its loss finite) never reaches the updater and says it is the data or
the model, not the learning rate."""

from __future__ import annotations

import pytest
import torch

from nan_gradient import MARKER, NaNGradientMLP
from torchspark import DataSet, Network, models, optim
from torchspark.errors import ConfigError, DataError, TrainingError
from torchspark.nn.divergence import NonFiniteGradient


def test_output_refuses_nan_features_by_default_naming_the_example() -> None:
    net = Network(models.mlp(4, 8, 3), seed=0)
    x = torch.randn(6, 4)
    x[2, 1] = float("nan")
    x[4, 3] = float("-inf")
    with pytest.raises(DataError, match=r"2 of 6 examples have NaN or inf features; the first is example 2, value 1"):
        net.output(x)
    with pytest.raises(ConfigError, match=r"non_finite must be one of \['error', 'null'\], got 'skip'"):
        net.output(x, non_finite="skip")


def test_output_null_gives_those_examples_nan_and_the_others_their_outputs() -> None:
    net = Network(models.mlp(4, 8, 3), seed=0)
    x = torch.randn(6, 4)
    x[2, 1] = float("nan")
    out = net.output(x, non_finite="null", batch_size=4)
    assert bool(out[2].isnan().all())
    kept = [0, 1, 3, 4, 5]
    assert torch.equal(out[kept], net.output(x[kept]))


def test_a_nan_gradient_with_a_finite_loss_names_the_model_and_leaves_the_updater_alone() -> None:
    net = Network(NaNGradientMLP(4, 8, 3), updater=optim.Adam(lr=1e-2), seed=0)
    x = torch.randn(8, 4)
    y = torch.randint(0, 3, (8,))
    net.train_step(DataSet(x, y))  # one healthy step: the updater has state
    params, state = net.params(), net.updater_state()
    x[3, 0] = MARKER
    with pytest.raises(NonFiniteGradient, match=r"the gradient is not finite \(\d+ of 67 entries") as info:
        net.train_step(DataSet(x, y))
    message = str(info.value)
    assert "the loss is finite" in message and "the learning rate is not the cause" in message
    assert "a log or a division of 0" in message and "Lower the learning rate" not in message
    assert isinstance(info.value, TrainingError) and info.value.iteration == 1 and info.value.bad > 0
    assert torch.equal(net.params(), params) and torch.equal(net.updater_state(), state)
    assert net.iteration == 1
