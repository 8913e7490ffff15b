"""Spark integration: sessions and ``SparkNetwork``; re-exports the training masters (which live in
:mod:`torchspark.training`). The only package importing pyspark."""

from torchspark.spark.export_batches import export_batches
from torchspark.spark.network import SparkNetwork
from torchspark.spark.session import check_java, local_session, session_scope
from torchspark.training.config.masters import ParameterAveragingTrainingMaster, TrainingMaster, master_from_json
from torchspark.training.config.mesh import MeshConfig
from torchspark.training.config.shared_master import SharedTrainingMaster

__all__ = ["SparkNetwork", "export_batches", "ParameterAveragingTrainingMaster", "SharedTrainingMaster", "TrainingMaster",
           "master_from_json", "MeshConfig", "local_session", "session_scope", "check_java"]
