"""Spark ML integration: ``TorchEstimator`` / ``TorchModel`` (Pipeline, CrossValidator, save/load)."""

from torchspark.nn.network_spec import NetworkSpec
from torchspark.spark.ml.estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel", "NetworkSpec"]
