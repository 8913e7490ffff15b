"""What runs on every rank of [`torchspark.launch.run`][torchspark.launch.run]: the rank's context and the calls a
user's training function makes inside it (`report`, `get_checkpoint`, `get_context`), the checkpoints it reports
(through the masters' atomic, checksummed store), its share of the data, and the body that runs the function.

This package never imports pyspark: the Spark stage (`torchspark.spark.launch`) and the local launcher
(`torchspark.launch`) both call [`run_rank`][torchspark.ranks.run_rank].
"""

from torchspark.ranks.body import RankSpec, run_rank
from torchspark.ranks.context import TrainContext, get_checkpoint, get_context, report

__all__ = ["RankSpec", "TrainContext", "get_checkpoint", "get_context", "report", "run_rank"]
