"""Early stopping with [`ParallelWrapper`][torchspark.parallel.ParallelWrapper] (DL4J's ``EarlyStoppingParallelTrainer``).

One epoch is one ``wrapper.fit(train, epochs=1)`` (the worker processes start once per epoch); the score is
computed on this process with the local calculators ([`LossCalculator`][torchspark.earlystopping.LossCalculator],
[`EvaluationCalculator`][torchspark.earlystopping.EvaluationCalculator]). The loop, conditions and savers are
[`torchspark.earlystopping`][torchspark.earlystopping].
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torchspark.earlystopping.trainer import EarlyStoppingConfiguration, EarlyStoppingListener, EpochByEpochTrainer
from torchspark.errors import ConfigError
from torchspark.nn import Network
from torchspark.parallel.wrapper import ParallelWrapper

__all__ = ["EarlyStoppingParallelTrainer"]


class EarlyStoppingParallelTrainer(EpochByEpochTrainer):
    """Train ``wrapper.network`` epoch by epoch with ``wrapper`` until the configuration says stop.

    Args:
        wrapper: the [`ParallelWrapper`][torchspark.parallel.ParallelWrapper]; its network is trained in place (after the run
            it holds the last epoch's weights; ``result.best_model`` the best).
        config: the [`EarlyStoppingConfiguration`][torchspark.earlystopping.EarlyStoppingConfiguration].
        train_data: what ``ParallelWrapper.fit`` takes, re-readable (a DataSet, a list of DataSets or of batch-file
            paths; a one-shot iterator would be empty after the first epoch and is refused).
        batch_size: as for ``ParallelWrapper.fit`` (None: the master's).
        listener: an [`EarlyStoppingListener`][torchspark.earlystopping.EarlyStoppingListener].
    """

    def __init__(
        self,
        wrapper: ParallelWrapper,
        config: EarlyStoppingConfiguration,
        train_data: Any,
        batch_size: int | None = None,
        listener: EarlyStoppingListener | None = None,
    ) -> None:
        if not isinstance(wrapper, ParallelWrapper):
            raise ConfigError(f"wrapper must be a ParallelWrapper, got {type(wrapper).__name__}")
        if not isinstance(config, EarlyStoppingConfiguration):
            raise ConfigError(f"config must be an EarlyStoppingConfiguration, got {type(config).__name__}")
        if isinstance(train_data, Iterator):
            raise ConfigError(
                "train_data is a one-shot iterator, but early stopping trains it once per epoch; "
                "pass a list (e.g. list(data)), a DataSet or batch-file paths"
            )
        self.wrapper = wrapper
        self.train_data, self.batch_size = train_data, batch_size
        super().__init__(config, listener, wrapper.add_progress_listener)

    @property
    def network(self) -> Network:
        return self.wrapper.network

    def _fit_epoch(self) -> float:
        self.wrapper.fit(self.train_data, epochs=1, batch_size=self.batch_size)
        return self.wrapper.score
