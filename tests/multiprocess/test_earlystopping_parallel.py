"""Early stopping with ParallelWrapper's worker processes (DL4J's EarlyStoppingParallelTrainer)."""

from __future__ import annotations

import pytest

from torchspark import Network, datasets, models, optim
from torchspark.earlystopping import (
    EarlyStoppingConfiguration,
    LossCalculator,
    MaxEpochs,
    ScoreTarget,
    TerminationReason,
)
from torchspark.errors import ConfigError
from torchspark.parallel import ParallelWrapper
from torchspark.parallel.earlystopping import EarlyStoppingParallelTrainer


def test_parallel_early_stopping_reaches_a_score_target() -> None:
    data = datasets.synthetic_classification(352, 4, 3, seed=1, noise=1.0)  # one task: train and validation
    train, val = data.slice(0, 256), data.slice(256, 352)
    net = Network(models.mlp(4, 16, 3), updater=optim.SGD(lr=0.2), seed=0)
    start = net.score(val)
    wrapper = ParallelWrapper(net, num_workers=2, averaging_frequency=2, progress=False, threads_per_worker=1)
    config = EarlyStoppingConfiguration(LossCalculator(val), epoch_conditions=[MaxEpochs(6), ScoreTarget(start * 0.9)])
    result = EarlyStoppingParallelTrainer(wrapper, config, train, batch_size=16).fit()
    assert result.termination_reason is TerminationReason.EPOCH_CONDITION
    assert "ScoreTarget" in result.termination_details and result.total_epochs < 6
    assert result.best_score < start * 0.9 and result.best_epoch == result.total_epochs - 1
    assert result.best_model.score(val) == pytest.approx(result.best_score, rel=1e-6)


def test_a_one_shot_iterator_is_refused() -> None:
    net = Network(models.mlp(4, 8, 3), seed=0)
    wrapper = ParallelWrapper(net, num_workers=2, progress=False)
    config = EarlyStoppingConfiguration(
        LossCalculator(datasets.synthetic_classification(8, 4, 3)), epoch_conditions=[MaxEpochs(2)]
    )
    with pytest.raises(ConfigError, match="one-shot iterator"):
        EarlyStoppingParallelTrainer(wrapper, config, iter([datasets.synthetic_classification(8, 4, 3)]))
