"""The training machinery shared by SparkNetwork and ParallelWrapper: the training masters (configuration),
worker loop, algorithms, communicators, runners. Nothing here imports pyspark."""

from torchspark.training.algorithms import ALGORITHMS, AveragingAlgorithm
from torchspark.training.averaging import AveragingSettings, averaging_epoch
from torchspark.training.comm import Communicator, SoloCommunicator, ThreadGroup, TorchDistCommunicator
from torchspark.training.devices import backend_for_device, device_for_task
from torchspark.training.hooks import NullRecorder, ProgressUpdate, ScoreReport, WorkerHooks
from torchspark.training.masters import ParameterAveragingTrainingMaster, TrainingMaster, master_from_json
from torchspark.training.mesh import MeshConfig
from torchspark.training.runner import InProcessRunner, Runner
from torchspark.training.shared_master import SharedTrainingMaster
from torchspark.training.worker import ItemSource, WorkerResult, WorkerTask, mean_score, merge_results, run_worker

__all__ = [
    "ALGORITHMS", "AveragingAlgorithm", "AveragingSettings", "averaging_epoch", "Communicator", "SoloCommunicator",
    "ThreadGroup", "TorchDistCommunicator", "backend_for_device", "device_for_task", "NullRecorder",
    "ProgressUpdate", "ScoreReport", "WorkerHooks", "InProcessRunner", "Runner", "ItemSource", "WorkerResult",
    "WorkerTask", "merge_results", "mean_score", "run_worker", "TrainingMaster", "ParameterAveragingTrainingMaster",
    "SharedTrainingMaster", "MeshConfig", "master_from_json",
]
