"""Early stopping on a real local[2] Spark session: SparkEarlyStoppingTrainer with distributed score calculators on
a validation DataFrame, the directory saver, and an iteration condition fed by the workers' live reports."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import torch
from torch import nn

from helpers import mlp_net
from torchspark import Network, datasets, optim
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

F, C = 4, 3
MASTER = ParameterAveragingTrainingMaster(
    batch_size_per_worker=16, num_workers=2, averaging_frequency=2, rdd_training_approach="direct", rng_seed=0
)


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
    config = EarlyStoppingConfiguration(
        SparkLossCalculator(spark, val), model_saver=saver, epoch_conditions=[MaxEpochs(3), NoImprovement(patience=2)]
    )
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
    config = EarlyStoppingConfiguration(
        SparkLossCalculator(spark, train), epoch_conditions=[MaxEpochs(5)], iteration_conditions=[MaxScore(-1.0)]
    )
    result = SparkEarlyStoppingTrainer(spark_net, config, train).fit()
    assert result.termination_reason is TerminationReason.ITERATION_CONDITION
    assert "MaxScore" in result.termination_details and result.total_epochs == 1
    assert "worker" in result.termination_details  # fired on a live report, not on the epoch's final score
    assert result.score_vs_epoch == {} and result.best_model is None and spark_net.network.epoch == 1


def _two_output_net(regression_first: bool) -> Network:
    class TwoOutputs(nn.Module):  # defined here: shipped to the executors by value
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(F, 16)
            self.cls = nn.Linear(16, C)
            self.reg = nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = torch.relu(self.body(x))
            return (self.reg(h), self.cls(h)) if regression_first else (self.cls(h), self.reg(h))

    losses = ["mse", "cross_entropy"] if regression_first else ["cross_entropy", "mse"]
    return Network(TwoOutputs(), loss=losses, updater=optim.SGD(lr=0.05), seed=0)


@pytest.mark.parametrize("regression_first", [True, False], ids=["regression-first", "classification-first"])
def test_early_stopping_reads_each_label_column_as_its_output_wants(spark, regression_first: bool) -> None:
    """A DataFrame with a regression output (float targets, none of them integers) and a classification output
    (class indices): early stopping reads every label column with its own output's loss, as ``SparkNetwork.fit``
    does, and trains the same network. It once read every column with the first loss's flag: with the regression
    output first the class indices became floats and every epoch failed."""
    data = datasets.synthetic_classification(96, F, C, seed=1, noise=2.0)
    targets = data.features[:, :1] * 0.5 + 0.25  # (N, 1) floats
    rows = [(x.tolist(), int(y), t.tolist()) for x, y, t in zip(data.features, data.labels, targets)]
    frame = spark.createDataFrame(rows, "features array<float>, cls long, reg array<float>").repartition(2).cache()
    columns = {"features_col": "features", "label_col": ["reg", "cls"] if regression_first else ["cls", "reg"]}
    config = EarlyStoppingConfiguration(SparkLossCalculator(spark, frame, **columns), epoch_conditions=[MaxEpochs(2)])
    stopped = SparkNetwork(spark, _two_output_net(regression_first), MASTER, progress=False)
    result = SparkEarlyStoppingTrainer(stopped, config, frame, **columns).fit()
    assert result.termination_reason is TerminationReason.EPOCH_CONDITION, result.termination_details
    assert result.total_epochs == 2 and sorted(result.score_vs_epoch) == [0, 1]
    # the same two epochs through SparkNetwork.fit give the same network
    reference = SparkNetwork(spark, _two_output_net(regression_first), MASTER, progress=False)
    for _ in range(2):
        reference.fit(frame, epochs=1, **columns)
    torch.testing.assert_close(stopped.network.params(), reference.network.params())
