"""Early stopping for ``SparkNetwork`` and ``ParallelWrapper`` (DL4J's ``org.deeplearning4j.earlystopping``).

Train epoch by epoch, score the network after each (a loss or any metric on validation data), keep the best model,
and stop on the first termination condition that fires::

    config = EarlyStoppingConfiguration(
        score_calculator=SparkLossCalculator(spark, validation_df),     # or LossCalculator(val) locally
        epoch_conditions=[MaxEpochs(50), NoImprovement(patience=5)],
        iteration_conditions=[MaxTime(3600), InvalidScore()],
        model_saver=DirectoryModelSaver("hdfs:///models/run1"))
    result = SparkEarlyStoppingTrainer(spark_net, config, train_df).fit()
    result.best_model, result.best_epoch, result.termination_reason, result.score_vs_epoch

This package has no Spark dependency: the Spark trainer and calculators are in
[`torchspark.spark.earlystopping`][torchspark.spark.earlystopping], the ParallelWrapper trainer in [`torchspark.parallel.earlystopping`][torchspark.parallel.earlystopping].
"""

from torchspark.earlystopping.conditions import (
    EpochTerminationCondition,
    InvalidScore,
    IterationTerminationCondition,
    MaxEpochs,
    MaxScore,
    MaxTime,
    NoImprovement,
    ScoreTarget,
    condition_from_dict,
)
from torchspark.earlystopping.savers import DirectoryModelSaver, InMemoryModelSaver, ModelSaver
from torchspark.earlystopping.scores import METRICS, EvaluationCalculator, LossCalculator, Metric, ScoreCalculator
from torchspark.earlystopping.trainer import (
    EarlyStoppingConfiguration,
    EarlyStoppingListener,
    EarlyStoppingResult,
    TerminationReason,
    run_early_stopping,
)

__all__ = [
    "EarlyStoppingConfiguration",
    "EarlyStoppingListener",
    "EarlyStoppingResult",
    "TerminationReason",
    "run_early_stopping",
    "EpochTerminationCondition",
    "IterationTerminationCondition",
    "MaxEpochs",
    "NoImprovement",
    "ScoreTarget",
    "MaxTime",
    "MaxScore",
    "InvalidScore",
    "condition_from_dict",
    "ModelSaver",
    "InMemoryModelSaver",
    "DirectoryModelSaver",
    "ScoreCalculator",
    "LossCalculator",
    "EvaluationCalculator",
    "Metric",
    "METRICS",
]
