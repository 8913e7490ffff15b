"""The evaluation methods of [`SparkNetwork`][torchspark.spark.SparkNetwork].

Bound to the object's session and network, so ``spark_net.evaluate(test_rdd)`` reads like DL4J's
``sparkNet.evaluate(rdd)``. Every method accepts what ``fit`` accepts: an RDD of DataSet/MultiDataSet, a DataFrame
(its columns named by ``features_col``, ``label_col``, ``feature_shape`` or one
[`Columns`][torchspark.data.Columns] value, ``columns=``) or batch-file paths (a directory, a glob, a list or an
RDD of str), and with ``loader=fn`` (``fn(path) -> DataSet``, as in ``fit_paths``) any files that function reads.
On a Spark Connect session: DataFrames and paths (no RDDs). Each method fills its evaluations with
`torchspark.spark.evaluation.do_evaluation`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torchspark.data import Columns
from torchspark.data.columns import FeaturesCol
from torchspark.evaluation import ROC, BaseEvaluation, RegressionEvaluation, ROCMultiClass
from torchspark.nn import Network
from torchspark.spark import evaluation as _ev

__all__ = ["EvaluationMethods"]


class EvaluationMethods:
    """Distributed evaluation of ``self.network`` on ``self.spark`` (a classic or a Spark Connect session).

    ``batch_size`` is the examples per forward pass on the executors (bigger is faster until memory runs out).
    ``columns=Columns(...)`` names a DataFrame's columns in one value, instead of ``features_col``, ``label_col``
    and ``feature_shape`` (giving both is a ConfigError).
    """

    sc: Any
    spark: Any
    network: Network

    def evaluate(
        self,
        data: Any,
        batch_size: int = _ev.DEFAULT_BATCH_SIZE,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        labels: Sequence[str] | None = None,
        output_index: int | None = None,
        loader: Callable[[str], Any] | None = None,
        columns: Columns | None = None,
    ) -> Any:
        """The evaluation matching the loss (``Evaluation`` for classifiers, ``RegressionEvaluation`` for mse),
        computed over the cluster and merged on the driver (or the Connect client). ``labels`` names the classes
        in ``stats()``. A network with one loss per output gets a list with one evaluation per output
        (``output_index`` picks one instead). ``loader=fn`` reads files that are not batch files
        (``fn(path) -> DataSet``, on the executors, once per file), as ``fit_paths(loader=...)`` does; ``data``
        must then be paths."""
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner="evaluate")
        return _ev.evaluate(self.spark, self.network, data, batch_size, cols, labels, output_index, loader)

    def evaluate_regression(
        self,
        data: Any,
        batch_size: int = _ev.DEFAULT_BATCH_SIZE,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        loader: Callable[[str], Any] | None = None,
        columns: Columns | None = None,
    ) -> RegressionEvaluation:
        """MSE, MAE, RMSE, RSE, R^2 and Pearson correlation per output column (``loader`` as in evaluate)."""
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner="evaluate_regression")
        return self._fill(data, RegressionEvaluation(), batch_size, cols, loader)

    def evaluate_roc(
        self,
        data: Any,
        threshold_steps: int = _ev.DEFAULT_ROC_THRESHOLD_STEPS,
        batch_size: int = _ev.DEFAULT_BATCH_SIZE,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        loader: Callable[[str], Any] | None = None,
        columns: Columns | None = None,
    ) -> ROC:
        """ROC/AUC of a binary classifier (1 sigmoid or 2 softmax outputs). ``threshold_steps``: 32 bins (DL4J's
        default) keeps partition state tiny but approximates the AUC; 0 is exact but ships every score to the
        driver; 200-1000 is close at any size."""
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner="evaluate_roc")
        return self._fill(data, ROC(threshold_steps), batch_size, cols, loader)

    def evaluate_roc_multi_class(
        self,
        data: Any,
        threshold_steps: int = _ev.DEFAULT_ROC_THRESHOLD_STEPS,
        batch_size: int = _ev.DEFAULT_BATCH_SIZE,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        loader: Callable[[str], Any] | None = None,
        columns: Columns | None = None,
    ) -> ROCMultiClass:
        """One-vs-all ROC per class (``auc(c)``, ``average_auc()``); ``threshold_steps`` as in evaluate_roc."""
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner="evaluate_roc_multi_class")
        return self._fill(data, ROCMultiClass(threshold_steps), batch_size, cols, loader)

    def do_evaluation(
        self,
        data: Any,
        *evaluations: BaseEvaluation,
        batch_size: int = _ev.DEFAULT_BATCH_SIZE,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        output_index: int = 0,
        loader: Callable[[str], Any] | None = None,
        columns: Columns | None = None,
    ) -> Any:
        """Fill several evaluations in one pass (e.g. ``Evaluation(), ROCMultiClass(64)``) from output
        ``output_index``; returns the one given, or a tuple in the order given."""
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner="do_evaluation")
        return _ev.do_evaluation(
            self.spark,
            self.network,
            data,
            *evaluations,
            batch_size=batch_size,
            columns=cols,
            output_index=output_index,
            loader=loader,
        )

    def _fill(
        self, data: Any, evaluation: Any, batch_size: int, columns: Columns, loader: Callable[[str], Any] | None
    ) -> Any:
        return _ev.do_evaluation(
            self.spark, self.network, data, evaluation, batch_size=batch_size, columns=columns, loader=loader
        )
