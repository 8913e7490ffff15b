"""Score calculators: what early stopping measures after an epoch (DL4J's ``ScoreCalculator``).

A calculator has ``minimize`` (is lower better?) and ``calculate(network) -> float``. The ones here run on the
calling process and suit [`ParallelWrapper`][torchspark.parallel.ParallelWrapper]; the Spark ones
([`torchspark.spark.earlystopping`][torchspark.spark.earlystopping]) compute the same numbers over a validation RDD or DataFrame on the cluster.

Metrics are a registry ([`METRICS`][torchspark.earlystopping.METRICS]): a name maps to the evaluation that computes it, how to read it, and its
direction. ``"loss"`` is not a metric: use a loss calculator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from torchspark.data import DataSet, MultiDataSet
from torchspark.errors import ConfigError
from torchspark.evaluation import ROC, BaseEvaluation, Evaluation, EvaluationBinary, RegressionEvaluation, ROCMultiClass
from torchspark.nn import Network
from torchspark.validation import check_int

__all__ = ["ScoreCalculator", "Metric", "METRICS", "metric_by_name", "LossCalculator", "EvaluationCalculator"]


class ScoreCalculator(Protocol):
    """Computes the score early stopping compares across epochs."""

    minimize: bool

    def calculate(self, network: Network) -> float: ...


@dataclass(frozen=True)
class Metric:
    """One named metric: a fresh evaluation to fill, how to read the metric from it, and whether lower is better."""

    name: str
    evaluation: Callable[[], BaseEvaluation]
    read: Callable[[Any], float]
    minimize: bool

    def value(self, evaluation: Any) -> float:
        return float(self.read(evaluation))


#: name -> Metric. Classification (Evaluation): accuracy, f1/precision/recall (class 1 of two classes, else the
#: macro average), matthews_correlation. Binary multi-label (EvaluationBinary): the ``binary_*`` averages. ROC:
#: auc/auprc of a binary classifier, average_auc of a multi-class one. Regression (RegressionEvaluation, averaged
#: over output columns): mse, mae, rmse, rse, r2, pearson.
METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("accuracy", Evaluation, lambda e: e.accuracy(), False),
        Metric("f1", Evaluation, lambda e: e.f1(), False),
        Metric("precision", Evaluation, lambda e: e.precision(), False),
        Metric("recall", Evaluation, lambda e: e.recall(), False),
        Metric("matthews_correlation", Evaluation, lambda e: e.matthews_correlation(), False),
        Metric("binary_accuracy", EvaluationBinary, lambda e: e.average_accuracy(), False),
        Metric("binary_f1", EvaluationBinary, lambda e: e.average_f1(), False),
        Metric("auc", ROC, lambda e: e.auc(), False),
        Metric("auprc", ROC, lambda e: e.auprc(), False),
        Metric("average_auc", ROCMultiClass, lambda e: e.average_auc(), False),
        Metric("mse", RegressionEvaluation, lambda e: e.average_mean_squared_error(), True),
        Metric("mae", RegressionEvaluation, lambda e: e.average_mean_absolute_error(), True),
        Metric("rmse", RegressionEvaluation, lambda e: e.average_root_mean_squared_error(), True),
        Metric("rse", RegressionEvaluation, lambda e: e.average_relative_squared_error(), True),
        Metric("r2", RegressionEvaluation, lambda e: e.average_r_squared(), False),
        Metric("pearson", RegressionEvaluation, lambda e: e.average_pearson_correlation(), False),
    )
}


def metric_by_name(metric: str | Metric) -> Metric:
    """A [`Metric`][torchspark.earlystopping.Metric] from its name (or the Metric itself, for a custom one)."""
    if isinstance(metric, Metric):
        return metric
    found = METRICS.get(metric) if isinstance(metric, str) else None
    if found is None:
        hint = " (for the loss use a loss calculator)" if metric == "loss" else ""
        raise ConfigError(f"unknown metric {metric!r}{hint}; choose one of {sorted(METRICS)} or pass a Metric")
    return found


def _check_data(owner: str, data: Any) -> None:
    if not isinstance(data, (DataSet, MultiDataSet, list, tuple)):
        raise ConfigError(
            f"{owner}: data must be a DataSet, a MultiDataSet or a list of them, got "
            f"{type(data).__name__} (for an RDD or DataFrame use torchspark.spark.earlystopping)"
        )


class LossCalculator:
    """The loss on validation data held by this process (DL4J's DataSetLossCalculator).

    Args:
        data: a DataSet/MultiDataSet or a list of them.
        average: mean loss per example (True) or the sum over examples.
        batch_size: examples per forward pass.
    """

    minimize = True

    def __init__(
        self, data: DataSet | MultiDataSet | Iterable[Any], average: bool = True, batch_size: int = 256
    ) -> None:
        _check_data("LossCalculator", data)
        check_int("batch_size", batch_size, 1, owner="LossCalculator")
        self.data, self.average, self.batch_size = data, bool(average), batch_size

    def calculate(self, network: Network) -> float:
        if self.average:
            return network.score(self.data, batch_size=self.batch_size)
        return float(network.score_examples(self.data, batch_size=self.batch_size).double().sum())


class EvaluationCalculator:
    """Any metric of [`METRICS`][torchspark.earlystopping.METRICS] (or a custom [`Metric`][torchspark.earlystopping.Metric]) on validation data held by this process (DL4J's
    ClassificationScoreCalculator, RegressionScoreCalculator, ROCScoreCalculator)."""

    def __init__(
        self, data: DataSet | MultiDataSet | Iterable[Any], metric: str | Metric = "accuracy", batch_size: int = 256
    ) -> None:
        _check_data("EvaluationCalculator", data)
        check_int("batch_size", batch_size, 1, owner="EvaluationCalculator")
        self.data, self.metric, self.batch_size = data, metric_by_name(metric), batch_size
        self.minimize = self.metric.minimize

    def calculate(self, network: Network) -> float:
        return self.metric.value(network.evaluate(self.data, self.metric.evaluation(), batch_size=self.batch_size))
