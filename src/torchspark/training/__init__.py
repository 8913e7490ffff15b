"""The training machinery shared by SparkNetwork and ParallelWrapper: the training masters (configuration),
worker loop, algorithms, communicators, runners. Nothing here imports pyspark."""

from torchspark.training.algorithms import ALGORITHMS
from torchspark.training.algorithms.averaging import AveragingAlgorithm, AveragingSettings, averaging_epoch
from torchspark.training.comm import Communicator, SoloCommunicator, ThreadGroup, TorchDistCommunicator
from torchspark.training.config.masters import ParameterAveragingTrainingMaster, TrainingMaster, master_from_json
from torchspark.training.config.mesh import MeshConfig
from torchspark.training.config.shared_master import SharedTrainingMaster
from torchspark.training.driver.runner import InProcessRunner, Runner
from torchspark.training.hooks import NullRecorder, ProgressUpdate, ScoreReport, WorkerHooks
from torchspark.training.task import WorkerResult, WorkerTask, mean_score, merge_results
from torchspark.training.worker.devices import backend_for_device, device_for_task
from torchspark.training.worker.loop import ItemSource, run_worker

__all__ = [
    "ALGORITHMS",
    "AveragingAlgorithm",
    "AveragingSettings",
    "averaging_epoch",
    "Communicator",
    "SoloCommunicator",
    "ThreadGroup",
    "TorchDistCommunicator",
    "backend_for_device",
    "device_for_task",
    "NullRecorder",
    "ProgressUpdate",
    "ScoreReport",
    "WorkerHooks",
    "InProcessRunner",
    "Runner",
    "ItemSource",
    "WorkerResult",
    "WorkerTask",
    "merge_results",
    "mean_score",
    "run_worker",
    "TrainingMaster",
    "ParameterAveragingTrainingMaster",
    "SharedTrainingMaster",
    "MeshConfig",
    "master_from_json",
]
