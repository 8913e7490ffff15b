"""The evaluation and inference half of :class:`~torchspark.spark.SparkNetwork`.

Thin methods over :mod:`torchspark.spark.evaluation` and :mod:`torchspark.spark.inference`, bound to the
object's session and network, so ``spark_net.evaluate(test_rdd)`` reads like DL4J's ``sparkNet.evaluate(rdd)``.
Every method accepts what ``fit`` accepts: an RDD of DataSet/MultiDataSet, a DataFrame (``features_col``,
``label_col``, ``feature_shape``) or batch-file paths (a list or an RDD of str).
"""

from __future__ import annotations

from typing import Any, Sequence

from torchspark.evaluation import ROC, BaseEvaluation, RegressionEvaluation, ROCMultiClass
from torchspark.nn import Network
from torchspark.spark import evaluation as _ev
from torchspark.spark import inference as _inf

__all__ = ["InferenceMethods"]


class InferenceMethods:
    """Distributed evaluation, scoring and prediction of ``self.network`` on ``self.sc``.

    ``batch_size`` is the examples per forward pass on the executors (bigger is faster until memory runs out).
    ``eval_workers`` (DL4J's evalNumWorkers) is refused with ConfigError: every running PySpark task holds one
    network copy, so ``spark.task.cpus`` is what bounds the copies per executor.
    """

    sc: Any
    spark: Any
    network: Network

    def evaluate(self, data: Any, batch_size: int = _ev.DEFAULT_BATCH_SIZE,
                 eval_workers: int | None = None, features_col: str = "features",
                 label_col: str | None = "label", feature_shape: Sequence[int] | None = None,
                 labels: Sequence[str] | None = None) -> Any:
        """The evaluation matching the loss (``Evaluation`` for classifiers, ``RegressionEvaluation`` for mse),
        computed over the cluster and merged with treeAggregate. ``labels`` names the classes in ``stats()``."""
        return _ev.evaluate(self.sc, self.network, data, batch_size, eval_workers, features_col, label_col,
                            feature_shape, labels)

    def evaluate_regression(self, data: Any, batch_size: int = _ev.DEFAULT_BATCH_SIZE,
                            eval_workers: int | None = None, features_col: str = "features",
                            label_col: str | None = "label",
                            feature_shape: Sequence[int] | None = None) -> RegressionEvaluation:
        """MSE, MAE, RMSE, RSE, R^2 and Pearson correlation per output column."""
        return _ev.evaluate_regression(self.sc, self.network, data, batch_size, eval_workers, features_col,
                                       label_col, feature_shape)

    def evaluate_roc(self, data: Any, threshold_steps: int = _ev.DEFAULT_ROC_THRESHOLD_STEPS,
                     batch_size: int = _ev.DEFAULT_BATCH_SIZE, eval_workers: int | None = None,
                     features_col: str = "features", label_col: str | None = "label",
                     feature_shape: Sequence[int] | None = None) -> ROC:
        """ROC/AUC of a binary classifier. ``threshold_steps``: 32 bins (DL4J's default) keeps partition state
        tiny; 0 is exact but ships every score to the driver; 200-1000 is close at any size."""
        return _ev.evaluate_roc(self.sc, self.network, data, threshold_steps, batch_size, eval_workers,
                                features_col, label_col, feature_shape)

    def evaluate_roc_multi_class(self, data: Any, threshold_steps: int = _ev.DEFAULT_ROC_THRESHOLD_STEPS,
                                 batch_size: int = _ev.DEFAULT_BATCH_SIZE,
                                 eval_workers: int | None = None, features_col: str = "features",
                                 label_col: str | None = "label",
                                 feature_shape: Sequence[int] | None = None) -> ROCMultiClass:
        """One-vs-all ROC per class (``auc(c)``, ``average_auc()``); ``threshold_steps`` as in evaluate_roc."""
        return _ev.evaluate_roc_multi_class(self.sc, self.network, data, threshold_steps, batch_size, eval_workers,
                                            features_col, label_col, feature_shape)

    def do_evaluation(self, data: Any, *evaluations: BaseEvaluation, batch_size: int = _ev.DEFAULT_BATCH_SIZE,
                      eval_workers: int | None = None, features_col: str = "features",
                      label_col: str | None = "label", feature_shape: Sequence[int] | None = None) -> Any:
        """Fill several evaluations in one pass (e.g. ``Evaluation(), ROCMultiClass(64)``); returns the one given,
        or a tuple in the order given."""
        return _ev.do_evaluation(self.sc, self.network, data, *evaluations, batch_size=batch_size,
                                 eval_workers=eval_workers, features_col=features_col, label_col=label_col,
                                 feature_shape=feature_shape)

    def feed_forward_with_key(self, rdd: Any, batch_size: int = _ev.DEFAULT_BATCH_SIZE) -> Any:
        """``RDD[(key, features)] -> RDD[(key, output)]``, one example each (no batch dimension), computed in
        batches of ``batch_size`` on the executors."""
        return _inf.feed_forward_with_key(self.sc, self.network, rdd, batch_size)

    def score_examples(self, data: Any, include_regularization: bool = False,
                       batch_size: int = _ev.DEFAULT_BATCH_SIZE, features_col: str = "features",
                       label_col: str | None = "label", feature_shape: Sequence[int] | None = None) -> Any:
        """``RDD[float]``: each example's loss (plus the L2 term when ``include_regularization``)."""
        return _inf.score_examples(self.sc, self.network, data, include_regularization, batch_size, features_col,
                                   label_col, feature_shape)

    def score_examples_with_key(self, rdd: Any, include_regularization: bool = False,
                                batch_size: int = _ev.DEFAULT_BATCH_SIZE) -> Any:
        """``RDD[(key, DataSet)] -> RDD[(key, loss)]`` for single-example DataSets (or (features, labels))."""
        return _inf.score_examples_with_key(self.sc, self.network, rdd, include_regularization, batch_size)

    def calculate_score(self, data: Any, average: bool = True, batch_size: int = _ev.DEFAULT_BATCH_SIZE,
                        features_col: str = "features", label_col: str | None = "label",
                        feature_shape: Sequence[int] | None = None) -> float:
        """The loss over all of ``data``: the mean per example (``average=True``) or the sum."""
        return float(_inf.calculate_score(self.sc, self.network, data, average, batch_size, features_col,
                                          label_col, feature_shape))

    def predict(self, dataframe: Any, features_col: str = "features", output_col: str = "prediction",
                feature_shape: Sequence[int] | None = None, batch_size: int = 1024,
                output: str = "probabilities") -> Any:
        """``dataframe`` plus ``output_col`` from a batched Arrow UDF that builds the network once per Python
        worker. ``output="probabilities"`` gives ``array<float>``; ``"class"`` gives the argmax as ``bigint``."""
        return _inf.predict(self.spark, self.network, dataframe, features_col, output_col, feature_shape,
                            batch_size, output)
