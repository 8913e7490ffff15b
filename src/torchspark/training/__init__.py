"""The training machinery shared by the Spark masters and ParallelWrapper: worker loop, algorithms,
communicators, runners. Nothing here imports pyspark."""

from torchspark.training.algorithms import ALGORITHMS, AveragingAlgorithm
from torchspark.training.averaging import AveragingSettings, averaging_epoch
from torchspark.training.comm import Communicator, SoloCommunicator, ThreadGroup, TorchDistCommunicator
from torchspark.training.devices import backend_for_device, device_for_task
from torchspark.training.hooks import NullRecorder, ProgressUpdate, ScoreReport, WorkerHooks
from torchspark.training.runner import InProcessRunner, Runner
from torchspark.training.worker import ItemSource, WorkerResult, WorkerTask, mean_score, merge_results, run_worker

__all__ = [
    "ALGORITHMS", "AveragingAlgorithm", "AveragingSettings", "averaging_epoch", "Communicator", "SoloCommunicator",
    "ThreadGroup", "TorchDistCommunicator", "backend_for_device", "device_for_task", "NullRecorder",
    "ProgressUpdate", "ScoreReport", "WorkerHooks", "InProcessRunner", "Runner", "ItemSource", "WorkerResult",
    "WorkerTask", "merge_results", "mean_score", "run_worker",
]
