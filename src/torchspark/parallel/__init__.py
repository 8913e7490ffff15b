"""ParallelWrapper: the training masters on one machine, with worker processes instead of Spark.

``ParallelWrapper(network, workers=2, training_mode="averaging" | "shared_gradients").fit(data)`` runs the same
worker loop as ``SparkNetwork`` with the matching master, so a configuration tried here behaves the same on a
cluster (identical parameters for the same seed, data order and settings).
"""

from torchspark.parallel.runner import LocalProcessRunner
from torchspark.parallel.wrapper import TRAINING_MODES, ParallelWrapper, plan_devices

__all__ = ["ParallelWrapper", "LocalProcessRunner", "TRAINING_MODES", "plan_devices"]
