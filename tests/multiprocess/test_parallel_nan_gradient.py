"""ParallelWrapper with real worker processes: a gradient that turns NaN on one worker for one step (its loss
finite) never reaches the gradient-sharing residual or the updater state; with ``on_divergence="warn"`` the step is
skipped and counted and the replicas stay bit-identical, with ``"fail"`` (and under parameter averaging) the fit
ends with advice that names the data or the model, not the learning rate."""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers import assert_replicas_identical
from nan_gradient import MARKER, NaNGradientMLP
from torchspark import DataSet, Network, datasets, optim
from torchspark.errors import TrainingError
from torchspark.parallel import ParallelWrapper

CLEAN = datasets.digits("train").slice(0, 320)


def _poisoned(row: int) -> DataSet:
    """The 320 digits with one row marked: the minibatch holding it gets a NaN gradient, its loss stays finite."""
    features = CLEAN.features.clone()
    features.reshape(len(CLEAN), -1)[row, 0] = MARKER
    return DataSet(features, CLEAN.labels)


def _net() -> Network:
    return Network(NaNGradientMLP(64, 16, 10), updater=optim.Adam(lr=1e-2), seed=0)


# row 3: the first minibatch (the round that calibrates the threshold); row 100: a later one (the fused step)
@pytest.mark.parametrize("row", [3, 100])
def test_a_nan_gradient_is_skipped_counted_and_never_enters_residual_or_updater(row: int) -> None:
    net = _net()
    wrapper = ParallelWrapper(
        net, num_workers=2, training_mode="sharing", progress=False, on_divergence="warn", collect_training_stats=True
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapper.fit(_poisoned(row), batch_size=16)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("gradient sharing skipped steps: the gradient is not finite" in m for m in messages), messages
    assert net.extra_config["sharing.skipped_steps"] == 1
    assert wrapper.training_stats.summary()["sharing.skipped_steps"] == 1
    assert "1 step(s) skipped over all workers" in net.extra_config["sharing.divergence"]
    residuals = {k: v for k, v in net.extra_state.items() if k.startswith("sharing.residual.")}
    assert len(residuals) == 2 and all(bool(torch.isfinite(r).all()) for r in residuals.values())
    assert bool(torch.isfinite(net.updater_state()).all()) and bool(torch.isfinite(net.params()).all())
    assert_replicas_identical(wrapper, 2, net=net)
    if row == 3:
        return
    # the next fit starts from that state (the averaged updater state, each worker's residual) and trains on
    before = net.params()
    wrapper.fit(CLEAN, batch_size=16)
    assert net.extra_config["sharing.skipped_steps"] == 0 and net.extra_config["sharing.divergence"] is None
    assert bool(torch.isfinite(net.updater_state()).all()) and bool(torch.isfinite(net.params()).all())
    assert all(bool(torch.isfinite(net.extra_state[k]).all()) for k in residuals)
    assert bool((net.params() != before).any())
    assert_replicas_identical(wrapper, 2, net=net)


def test_a_nan_gradient_fails_the_sharing_fit_naming_the_model_not_the_learning_rate() -> None:
    wrapper = ParallelWrapper(_net(), num_workers=2, training_mode="sharing", progress=False)
    with pytest.raises(TrainingError, match=r"the gradient is not finite \(\d+ of 1210 entries") as info:
        wrapper.fit(_poisoned(100), batch_size=16)
    message = str(info.value)
    assert "the loss is finite" in message and "the learning rate is not the cause" in message, message
    assert "a log or a division of 0" in message and "on_divergence='warn' skips such steps" in message
    assert "Lower the learning rate" not in message


def test_a_nan_gradient_fails_parameter_averaging_with_the_same_advice() -> None:
    wrapper = ParallelWrapper(_net(), num_workers=2, training_mode="averaging", progress=False, averaging_frequency=1)
    with pytest.raises(TrainingError, match=r"the gradient is not finite .* the learning rate is not the cause"):
        wrapper.fit(_poisoned(100), batch_size=16)
