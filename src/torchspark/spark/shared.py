"""Moved to :mod:`torchspark.training.config.shared_master` (masters are training configuration, not Spark code); this
module keeps old imports working."""

from torchspark.training.config.shared_master import SharedTrainingMaster

__all__ = ["SharedTrainingMaster"]
