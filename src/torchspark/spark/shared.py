"""Moved to :mod:`torchspark.training.shared_master` (masters are training configuration, not Spark code); this
module keeps old imports working."""

from torchspark.training.shared_master import SharedTrainingMaster

__all__ = ["SharedTrainingMaster"]
