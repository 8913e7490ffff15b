"""Early stopping on Spark (DL4J's ``SparkEarlyStoppingTrainer`` and its distributed score calculators).

One epoch is one ``SparkNetwork.fit(train, epochs=1)``; after it the score is computed over the validation RDD or
DataFrame on the cluster ([`SparkLossCalculator`][torchspark.spark.earlystopping.SparkLossCalculator], [`SparkEvaluationCalculator`][torchspark.spark.earlystopping.SparkEvaluationCalculator]: partial results merged
with ``treeAggregate``, nothing but the totals reaches the driver). The loop itself, the conditions and the savers
are [`torchspark.earlystopping`][torchspark.earlystopping].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchspark.data import Columns
from torchspark.data.columns import FeaturesCol
from torchspark.earlystopping.scores import Metric, metric_by_name
from torchspark.earlystopping.trainer import EarlyStoppingConfiguration, EarlyStoppingListener, EpochByEpochTrainer
from torchspark.errors import ConfigError
from torchspark.nn import Network
from torchspark.spark.dataframes import network_batches
from torchspark.spark.evaluation import DEFAULT_BATCH_SIZE, do_evaluation
from torchspark.spark.inference import calculate_score
from torchspark.spark.network import SparkNetwork
from torchspark.spark.session import spark_context
from torchspark.spark.session_kinds import is_connect_session
from torchspark.validation import check_int

__all__ = ["SparkLossCalculator", "SparkEvaluationCalculator", "SparkEarlyStoppingTrainer"]


class _DataArgs:
    """Validation data and how to read it (what ``SparkNetwork.fit`` accepts)."""

    def __init__(
        self,
        spark: Any,
        data: Any,
        batch_size: int,
        columns: Columns,
    ) -> None:
        #: where the scores are computed: the SparkContext, or the Spark Connect session itself (no SparkContext)
        self.sc = spark if is_connect_session(spark) else spark_context(spark)
        check_int("batch_size", batch_size, 1)
        if data is None:
            raise ConfigError("validation data is None; pass an RDD of DataSets, a DataFrame or batch-file paths")
        self.data, self.batch_size, self.columns = data, batch_size, columns


class SparkLossCalculator(_DataArgs):
    """The loss over validation data, computed on the cluster (DL4J's SparkDataSetLossCalculator).

    Args:
        spark: SparkSession or SparkContext.
        data: an RDD of DataSet/MultiDataSet, a DataFrame (``features_col``, ``label_col``, ``feature_shape`` or
            ``columns`` as for ``SparkNetwork.fit``) or batch-file paths. Persist an RDD or DataFrame that is costly to recompute: it is
            read once per evaluated epoch.
        average: mean loss per example (True) or the sum.
        batch_size: examples per forward pass on the executors.
    """

    minimize = True

    def __init__(
        self,
        spark: Any,
        data: Any,
        average: bool = True,
        batch_size: int = DEFAULT_BATCH_SIZE,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        columns: Columns | None = None,
    ) -> None:
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner=type(self).__name__)
        super().__init__(spark, data, batch_size, cols)
        self.average = bool(average)

    def calculate(self, network: Network) -> float:
        return float(
            calculate_score(
                self.sc,
                network,
                self.data,
                self.average,
                self.batch_size,
                self.columns,
            )
        )


class SparkEvaluationCalculator(_DataArgs):
    """A metric of [`torchspark.earlystopping.METRICS`][torchspark.earlystopping.METRICS] (accuracy, f1, auc, mse, r2 ...) or a custom
    [`Metric`][torchspark.earlystopping.Metric] over validation data, computed on the cluster with mergeable
    evaluations (exact: equals one local pass). Arguments as for [`SparkLossCalculator`][torchspark.spark.earlystopping.SparkLossCalculator]."""

    def __init__(
        self,
        spark: Any,
        data: Any,
        metric: str | Metric = "accuracy",
        batch_size: int = DEFAULT_BATCH_SIZE,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        columns: Columns | None = None,
    ) -> None:
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner=type(self).__name__)
        super().__init__(spark, data, batch_size, cols)
        self.metric = metric_by_name(metric)
        self.minimize = self.metric.minimize

    def calculate(self, network: Network) -> float:
        ev = do_evaluation(
            self.sc,
            network,
            self.data,
            self.metric.evaluation(),
            batch_size=self.batch_size,
            columns=self.columns,
        )
        return self.metric.value(ev)


class SparkEarlyStoppingTrainer(EpochByEpochTrainer):
    """Train ``spark_network`` epoch by epoch on ``train_data`` until the configuration says stop.

    Args:
        spark_network: a [`SparkNetwork`][torchspark.spark.SparkNetwork] with its training master; its network is trained
            in place (after the run it holds the *last* epoch's weights; ``result.best_model`` the best).
        config: the [`EarlyStoppingConfiguration`][torchspark.earlystopping.EarlyStoppingConfiguration].
        train_data: what ``SparkNetwork.fit`` takes: an RDD of DataSet/MultiDataSet or a DataFrame (``fit_paths``
            data: pass ``paths=`` instead).
        features_col, label_col, feature_shape, columns: DataFrame columns, as for ``SparkNetwork.fit``.
        paths: batch-file paths (a list or an RDD of str) trained with ``fit_paths`` instead of ``train_data``.
        listener: an [`EarlyStoppingListener`][torchspark.earlystopping.EarlyStoppingListener].

    Each epoch is its own fit (a new barrier stage). A DataFrame is turned into one RDD of Arrow-built minibatches
    up front, so that every epoch fits the same RDD: ``SparkNetwork`` then prepares it (export or repartition) once
    and later epochs reuse that. On a Spark Connect session every epoch streams the DataFrame (cache it when it is
    costly to compute); [`SparkLossCalculator`][torchspark.spark.earlystopping.SparkLossCalculator] and [`SparkEvaluationCalculator`][torchspark.spark.earlystopping.SparkEvaluationCalculator] score a DataFrame or batch
    files there (not an RDD).
    """

    def __init__(
        self,
        spark_network: SparkNetwork,
        config: EarlyStoppingConfiguration,
        train_data: Any = None,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        paths: Any = None,
        listener: EarlyStoppingListener | None = None,
        columns: Columns | None = None,
    ) -> None:
        if not isinstance(spark_network, SparkNetwork):
            raise ConfigError(f"spark_network must be a SparkNetwork, got {type(spark_network).__name__}")
        if spark_network.master is None:
            raise ConfigError("the SparkNetwork has no master; pass one to train")
        if not isinstance(config, EarlyStoppingConfiguration):
            raise ConfigError(f"config must be an EarlyStoppingConfiguration, got {type(config).__name__}")
        if (train_data is None) == (paths is None):
            raise ConfigError("pass exactly one of train_data (an RDD or DataFrame) and paths (batch files)")
        self.spark_network = spark_network
        self.paths = paths
        self.columns = Columns.of(columns, features_col, label_col, feature_shape, owner="SparkEarlyStoppingTrainer")
        # one RDD for every epoch (a DataFrame would become a new RDD, exported again, at every fit); a Spark
        # Connect session has no RDDs: each epoch streams the DataFrame itself
        self.train_data = (
            train_data
            if train_data is None or spark_network.sc is None
            else network_batches(spark_network.network, train_data, self.columns)
        )
        super().__init__(config, listener, spark_network.add_progress_listener)

    @property
    def network(self) -> Network:
        return self.spark_network.network

    def _fit_epoch(self) -> float:
        net = self.spark_network
        if self.paths is not None:
            net.fit_paths(self.paths, epochs=1)
        else:
            net.fit(self.train_data, epochs=1, columns=self.columns)
        return net.score
