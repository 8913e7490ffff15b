"""Spark integration: sessions and ``SparkNetwork``; re-exports the training masters (which live in
[`torchspark.training`][torchspark.training]). The only package importing pyspark."""

try:  # the rest of torchspark works without pyspark (a GPU box, a laptop); this package does not
    import pyspark  # noqa: F401
except ImportError as _missing:
    raise ModuleNotFoundError(
        f"torchspark.spark needs pyspark, which this Python cannot import ({_missing}): `pip install "
        "'torchspark[spark]'` (classic Spark; it needs Java 17 or newer), or `pip install "
        "'torchspark[connect-client]'` (a client of a Spark Connect server), or train on one machine without Spark with "
        "torchspark.parallel.ParallelWrapper (`torchspark train --parallel`)",
        name=_missing.name,
    ) from _missing

from torchspark.spark.batch_export import export_batches
from torchspark.spark.network import SparkNetwork
from torchspark.spark.session import check_java, local_session, remote_session, session_scope
from torchspark.training.config.masters import ParameterAveragingTrainingMaster, TrainingMaster, master_from_json
from torchspark.training.config.mesh import MeshConfig
from torchspark.training.config.shared_master import SharedTrainingMaster

__all__ = [
    "SparkNetwork",
    "export_batches",
    "ParameterAveragingTrainingMaster",
    "SharedTrainingMaster",
    "TrainingMaster",
    "master_from_json",
    "MeshConfig",
    "local_session",
    "remote_session",
    "session_scope",
    "check_java",
]
