"""The Connect progress options on a classic session: refused by name (they would be silently ignored there)."""

from __future__ import annotations

import pytest
from torch import nn

from torchspark import Network, optim
from torchspark.errors import ConfigError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork


@pytest.mark.parametrize(
    "option, shown",
    [
        ({"progress_channel": "directory"}, "progress_channel='directory'"),
        ({"progress_directory": "/tmp/progress"}, "progress_directory='/tmp/progress'"),
        ({"progress_poll_s": 5.0}, "progress_poll_s=5.0"),
    ],
)
def test_connect_progress_options_are_refused_on_a_classic_session(spark, option, shown) -> None:
    net = Network(nn.Linear(2, 3), updater=optim.SGD(lr=0.1))
    with pytest.raises(ConfigError, match=f"{shown}.*Spark Connect session only.*drop these arguments"):
        SparkNetwork(spark, net, ParameterAveragingTrainingMaster(), **option)
    SparkNetwork(spark, net, ParameterAveragingTrainingMaster())  # the defaults are fine
