"""torchspark: distributed training of PyTorch networks on Apache Spark.

Parameter averaging and threshold-encoded gradient sharing (Strom 2015), distributed evaluation and inference,
training-stats timelines, and a single-machine ParallelWrapper — the Deeplearning4j-on-Spark feature set, in Python.
"""

from __future__ import annotations

__version__ = "0.1.0"

from torchspark import datasets, errors, models, optim
from torchspark.data import DataSet, MultiDataSet, load_batch, save_batches
from torchspark.nn import Network, from_factory

__all__ = [
    "__version__",
    "DataSet",
    "MultiDataSet",
    "Network",
    "datasets",
    "errors",
    "from_factory",
    "load_batch",
    "models",
    "optim",
    "save_batches",
]
