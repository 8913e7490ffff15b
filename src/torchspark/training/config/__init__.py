"""The training masters: the user's configuration of a distributed fit (which algorithm, its knobs, checkpoints,
recovery, how workers meet), validated at construction and round-tripping through JSON/YAML. Plain data: the driver
turns a master into a [`WorkerTask`][torchspark.training.WorkerTask].

* [`ParameterAveragingTrainingMaster`][torchspark.ParameterAveragingTrainingMaster] (`masters`, with the common base);
* [`SharedTrainingMaster`][torchspark.SharedTrainingMaster] (`shared_master`);
* [`MeshConfig`][torchspark.MeshConfig] (`mesh`): addresses, ports and timeouts of the workers' mesh.
"""

from torchspark.training.config.masters import (
    ParameterAveragingTrainingMaster,
    TrainingMaster,
    master_class,
    master_from_json,
    master_kinds,
)
from torchspark.training.config.mesh import MeshConfig
from torchspark.training.config.shared_master import SharedTrainingMaster

__all__ = [
    "TrainingMaster",
    "ParameterAveragingTrainingMaster",
    "SharedTrainingMaster",
    "MeshConfig",
    "master_from_json",
    "master_class",
    "master_kinds",
]
