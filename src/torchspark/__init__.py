"""torchspark: distributed training of PyTorch networks on Apache Spark.

Parameter averaging and threshold-encoded gradient sharing (Strom 2015), distributed evaluation and inference,
training-stats timelines, and a single-machine ParallelWrapper — the Deeplearning4j-on-Spark feature set, in Python.
"""

from __future__ import annotations

__version__ = "0.2.0.dev0"

import importlib
from typing import Any

from torchspark import datasets, encoding, errors, evaluation, models, optim, schedules, stats
from torchspark.data import DataSet, MultiDataSet, load_batch, save_batches
from torchspark.evaluation import Evaluation, RegressionEvaluation
from torchspark.nn import Network, from_factory
from torchspark.training.config import (
    MeshConfig,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    TrainingMaster,
    master_from_json,
)

# imported on first use: ``spark`` needs pyspark, ``parallel`` starts nothing but is not needed by most users,
# ``ddp`` (the DDP communication hook) and ``launch`` (``run(fn)``) only by users of their own training loop
_LAZY = ("spark", "parallel", "ddp", "launch")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return importlib.import_module(f"torchspark.{name}")
    raise AttributeError(f"module 'torchspark' has no attribute {name!r}")


__all__ = [
    "__version__",
    "DataSet",
    "Evaluation",
    "MeshConfig",
    "ParameterAveragingTrainingMaster",
    "SharedTrainingMaster",
    "TrainingMaster",
    "master_from_json",
    "RegressionEvaluation",
    "MultiDataSet",
    "Network",
    "datasets",
    "ddp",
    "encoding",
    "errors",
    "evaluation",
    "from_factory",
    "launch",
    "load_batch",
    "models",
    "optim",
    "parallel",
    "save_batches",
    "schedules",
    "spark",
    "stats",
]
