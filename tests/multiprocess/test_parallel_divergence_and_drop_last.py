"""ParallelWrapper with real worker processes: ``on_divergence`` honoured both ways, ``drop_last`` honoured, and
the progress bar shows the total, the percentage and the time left."""

from __future__ import annotations

import warnings
from functools import partial

import pytest

from helpers import mlp_net
from torchspark import Network, datasets, models, optim
from torchspark.errors import ConfigError, TrainingError
from torchspark.parallel import ParallelWrapper

TRAIN = datasets.digits("train").slice(0, 320)


_diverging = partial(mlp_net, 64, 16, 10, updater=optim.SGD(lr=1e12))


def test_diverging_gradient_sharing_fails_by_default() -> None:
    wrapper = ParallelWrapper(_diverging(), num_workers=2, training_mode="sharing", progress=False)
    with pytest.raises(TrainingError, match=r"the update exploded.*the updater diverged\. Lower the learning rate"):
        wrapper.fit(TRAIN, batch_size=16)


def test_on_divergence_warn_keeps_training_and_warns() -> None:
    net = _diverging()
    wrapper = ParallelWrapper(net, num_workers=2, training_mode="sharing", progress=False, on_divergence="warn")
    with pytest.warns(RuntimeWarning, match=r"training diverged: .*Lower the learning rate"):
        wrapper.fit(TRAIN, batch_size=16)
    assert net.epoch == 1 and "exploded" in net.extra_config["sharing.divergence"]


def test_on_divergence_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"on_divergence must be one of \['fail', 'warn'\], got 'ignore'"):
        ParallelWrapper(_diverging(), num_workers=2, training_mode="sharing", on_divergence="ignore")


def test_drop_last_and_the_progress_bar_total(capfd) -> None:
    data = datasets.synthetic_classification(66, 6, 3, seed=1)
    kept = ParallelWrapper(Network(models.mlp(6, 8, 3), seed=0), num_workers=2, progress=True, averaging_frequency=1)
    kept.fit(data, epochs=2, batch_size=16)
    err = capfd.readouterr().err
    assert "100%" in err and "132/132" in err, err[-2000:]  # total known: percentage, count of total, time left
    assert sorted(r.examples for r in kept.last_results) == [66, 66]
    dropped = ParallelWrapper(
        Network(models.mlp(6, 8, 3), seed=0), num_workers=2, progress=False, averaging_frequency=1, drop_last=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        dropped.fit(data, epochs=2, batch_size=16)
    assert sorted((r.examples, r.iterations) for r in dropped.last_results) == [(64, 4), (64, 4)]
