"""Your own training loop on Spark or on one machine: [`run`][torchspark.launch.run] (TorchDistributor's contract,
with recovery from checkpoints, live progress and data from a DataFrame) and the calls a training function makes
inside it ([`report`][torchspark.ranks.report], [`get_checkpoint`][torchspark.ranks.get_checkpoint],
[`get_context`][torchspark.ranks.get_context]). The guide "Your own training loop" shows it end to end.
"""

from torchspark.launch.api import Distributor, RunOutcome, TorchDistributor, last_outcome, run
from torchspark.ranks import TrainContext, get_checkpoint, get_context, report

__all__ = [
    "Distributor",
    "RunOutcome",
    "TorchDistributor",
    "TrainContext",
    "get_checkpoint",
    "get_context",
    "last_outcome",
    "report",
    "run",
]
