"""The inference methods of :class:`~torchspark.spark.SparkNetwork` (scoring and prediction).

Thin methods over :mod:`torchspark.spark.inference`, bound to the object's session and network, so
``spark_net.predict(df)`` reads like DL4J's ``sparkNet`` calls. The evaluation methods are in
:mod:`torchspark.spark.evaluation_methods`.
"""

from __future__ import annotations

from typing import Any, Sequence

from torchspark.nn import Network
from torchspark.spark import evaluation as _ev
from torchspark.spark import inference as _inf

__all__ = ["InferenceMethods"]


class InferenceMethods:
    """Distributed scoring and prediction of ``self.network`` on ``self.sc``.

    ``batch_size`` is the examples per forward pass on the executors (bigger is faster until memory runs out).
    """

    sc: Any
    spark: Any
    network: Network

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

    def predict(self, dataframe: Any, features_col: str | Sequence[str] = "features",
                output_col: str = "prediction", feature_shape: Any = None, batch_size: int = 1024,
                output: str = "probabilities", output_index: int = 0) -> Any:
        """``dataframe`` plus ``output_col`` from a batched Arrow UDF that builds the network once per Python
        worker. ``output="probabilities"`` gives ``array<float>``; ``"class"`` gives the argmax as ``bigint``.
        A list of ``features_col`` feeds a network with several inputs; ``output_index`` picks the output."""
        return _inf.predict(self.spark, self.network, dataframe, features_col, output_col, feature_shape,
                            batch_size, output, output_index)
