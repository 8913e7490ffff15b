"""Spark integration: sessions, ``SparkNetwork`` and the training masters. The only package importing pyspark."""

from torchspark.spark.masters import ParameterAveragingTrainingMaster, TrainingMaster, master_from_json
from torchspark.spark.network import SparkNetwork
from torchspark.spark.session import check_java, local_session, session_scope
from torchspark.spark.shared import SharedTrainingMaster

__all__ = ["SparkNetwork", "ParameterAveragingTrainingMaster", "SharedTrainingMaster", "TrainingMaster",
           "master_from_json", "local_session", "session_scope", "check_java"]
