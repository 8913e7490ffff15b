"""ParallelWrapper: the training masters on one machine, with worker processes instead of Spark."""

from torchspark.parallel.runner import LocalProcessRunner
from torchspark.parallel.wrapper import TRAINING_MODES, ParallelWrapper

__all__ = ["ParallelWrapper", "LocalProcessRunner", "TRAINING_MODES"]
