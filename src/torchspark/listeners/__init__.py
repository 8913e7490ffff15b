"""Training listeners on the driver: follow a fit (its start, progress, epochs, end) as it runs.

Attach one with ``SparkNetwork.add_training_listener`` or ``ParallelWrapper.add_training_listener``. Events come
from the fit's progress channel (iteration, epoch, score, examples/s, gradient-sharing traffic), summed over
workers by [`TrainingEvents`][torchspark.listeners.TrainingEvents]. Two built-ins are optional extras, imported only when used:

* ``torchspark.listeners.mlflow_listener.MlflowListener`` (``pip install 'torchspark[mlflow]'``): the master's
  and network's settings as run params, metrics per epoch, the final model and the stats HTML as artifacts;
* ``torchspark.listeners.tensorboard_listener.TensorBoardListener`` (``pip install 'torchspark[tensorboard]'``):
  ``SummaryWriter`` scalars per progress report and per epoch.

Write your own by subclassing [`TrainingListener`][torchspark.listeners.TrainingListener] and overriding the methods you need.
"""

from torchspark.listeners.events import EpochEvent, FitEnded, FitStarted, IterationEvent, TrainingListener
from torchspark.listeners.hub import TrainingEvents, network_params

__all__ = [
    "TrainingListener",
    "FitStarted",
    "IterationEvent",
    "EpochEvent",
    "FitEnded",
    "TrainingEvents",
    "network_params",
]
