"""Early stopping on a real local[2] Spark session: SparkEarlyStoppingTrainer with distributed score calculators on
a validation DataFrame, the directory saver, and an iteration condition fed by the workers' live reports."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest

from torchspark import Network, datasets, models, optim
from torchspark.earlystopping import (
    DirectoryModelSaver,
    EarlyStoppingConfiguration,
    MaxEpochs,
    MaxScore,
    NoImprovement,
    TerminationReason,
)
from torchspark.evaluation import Evaluation
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork
from torchspark.spark.earlystopping import SparkEarlyStoppingTrainer, SparkEvaluationCalculator, SparkLossCalculator
from helpers import mlp_net

pytestmark = pytest.mark.spark

F, C = 4, 3
MASTER = ParameterAveragingTrainingMaster(batch_size_per_worker=16, num_workers=2, averaging_frequency=2,
                                          rdd_training_approach="direct", rng_seed=0)


def _frame(spark, start: int, stop: int):
    # one task (same seed: same class centroids); train and validation are slices of it
    data = datasets.synthetic_classification(288, F, C, seed=1, noise=2.0).slice(start, stop)
    rows = [(x.tolist(), float(y)) for x, y in zip(data.features, data.labels)]
    return spark.createDataFrame(rows, ["features", "label"]).repartition(2).cache(), data


_net = partial(mlp_net, F, 16, C, updater=optim.SGD(lr=0.05))


def test_spark_early_stopping_with_distributed_scores_and_a_directory_saver(spark, tmp_path) -> None:
    train, _ = _frame(spark, 0, 192)
    val, val_local = _frame(spark, 192, 288)
    spark_net = SparkNetwork(spark, _net(), MASTER, progress=False)
    saver = DirectoryModelSaver(str(tmp_path / "es"))
    config = EarlyStoppingConfiguration(SparkLossCalculator(spark, val), model_saver=saver,
                                        epoch_conditions=[MaxEpochs(3), NoImprovement(patience=2)])
    result = SparkEarlyStoppingTrainer(spark_net, config, train).fit()
    assert result.termination_reason is TerminationReason.EPOCH_CONDITION and "MaxEpochs" in result.termination_details
    assert result.total_epochs == 3 and sorted(result.score_vs_epoch) == [0, 1, 2]
    assert result.best_score == min(result.score_vs_epoch.values()) < result.score_vs_epoch[0]
    # the distributed loss is the local loss of the same model; the saved best model is that model
    best = DirectoryModelSaver.load_best(str(tmp_path / "es"))
    assert best.score(val_local) == pytest.approx(result.best_score, rel=1e-5)
    assert result.best_model.params().equal(best.params())
    # a metric computed on the cluster equals the local evaluation
    accuracy = SparkEvaluationCalculator(spark, val, "accuracy")
    assert accuracy.minimize is False
    assert accuracy.calculate(best) == best.evaluate(val_local, Evaluation()).accuracy()


def test_an_iteration_condition_fires_on_live_worker_scores(spark) -> None:
    train, _ = _frame(spark, 0, 128)
    # minibatches of 4: 16 steps per worker, so workers report progress (every 10 steps) during the epoch
    spark_net = SparkNetwork(spark, _net(), dataclasses.replace(MASTER, batch_size_per_worker=4), progress=False)
    # every loss is above -1: the condition fires during epoch 0, which still finishes; no score is computed
    config = EarlyStoppingConfiguration(SparkLossCalculator(spark, train), epoch_conditions=[MaxEpochs(5)],
                                        iteration_conditions=[MaxScore(-1.0)])
    result = SparkEarlyStoppingTrainer(spark_net, config, train).fit()
    assert result.termination_reason is TerminationReason.ITERATION_CONDITION
    assert "MaxScore" in result.termination_details and result.total_epochs == 1
    assert "worker" in result.termination_details  # fired on a live report, not on the epoch's final score
    assert result.score_vs_epoch == {} and result.best_model is None and spark_net.network.epoch == 1
