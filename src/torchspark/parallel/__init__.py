"""ParallelWrapper: the training masters on one machine, with worker processes instead of Spark.

``ParallelWrapper(network, num_workers=2, training_mode="averaging" | "sharing").fit(data)`` runs the same
worker loop as ``SparkNetwork`` with the matching master, so a configuration tried here behaves the same on a
cluster (identical parameters for the same seed, data order and settings).
"""

from torchspark.parallel.devices import plan_devices
from torchspark.parallel.runner import LocalProcessRunner
from torchspark.parallel.wrapper import ParallelWrapper

__all__ = ["ParallelWrapper", "LocalProcessRunner", "plan_devices"]
