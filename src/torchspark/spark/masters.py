"""Moved to :mod:`torchspark.training.config.masters` (masters are training configuration, not Spark code); this
module keeps old imports working."""

from torchspark.training.config.masters import *  # noqa: F401,F403
from torchspark.training.config.masters import ParameterAveragingTrainingMaster, TrainingMaster, master_from_json

__all__ = ["TrainingMaster", "ParameterAveragingTrainingMaster", "master_from_json"]
