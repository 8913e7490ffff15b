"""The inference methods of [`SparkNetwork`][torchspark.spark.SparkNetwork] (scoring and prediction).

Bound to the object's session and network, so ``spark_net.predict(df)`` reads like DL4J's ``sparkNet`` calls; each
method names a DataFrame's columns with ``features_col``/``label_col``/``feature_shape`` or one
[`Columns`][torchspark.data.Columns] value (``columns=``) and runs the function of
`torchspark.spark.inference` of the same name. The evaluation methods are in
`torchspark.spark.evaluation_methods`. An RDD in gives an RDD out (classic sessions only); a DataFrame in gives
a DataFrame out, on any session (the route on Spark Connect).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchspark.data import Columns
from torchspark.data.columns import FeaturesCol
from torchspark.nn import Network
from torchspark.spark import evaluation as _ev
from torchspark.spark import inference as _inf

__all__ = ["InferenceMethods"]


class InferenceMethods:
    """Distributed scoring and prediction of ``self.network`` on ``self.spark`` (a classic or a Connect session).

    ``batch_size`` is the examples per forward pass on the executors (bigger is faster until memory runs out).
    ``columns=Columns(...)`` names a DataFrame's columns in one value, instead of ``features_col``, ``label_col``
    and ``feature_shape`` (giving both is a ConfigError).
    """

    sc: Any
    spark: Any
    network: Network

    def feed_forward_with_key(
        self,
        data: Any,
        batch_size: int = _ev.DEFAULT_BATCH_SIZE,
        key_col: str = "key",
        features_col: FeaturesCol = "features",
        feature_shape: Any = None,
        output_col: str = "output",
        output_index: int = 0,
        non_finite: str = "error",
        columns: Columns | None = None,
    ) -> Any:
        """``RDD[(key, features)] -> RDD[(key, output)]``, one example each (no batch dimension), computed in
        batches of ``batch_size`` on the executors. A DataFrame with ``key_col`` and ``features_col`` gives a
        DataFrame ``key_col, output_col`` (the output flattened to ``array<float>``; ``output_index`` picks the
        output of a several-output network). An example with NaN/inf features fails the action with DataError
        naming its key (``non_finite="error"``, default) or gets a null/NaN output (``"null"``)."""
        cols = Columns.of(columns, features_col, "label", feature_shape, owner="feed_forward_with_key")
        return _inf.feed_forward_with_key(
            self.spark, self.network, data, batch_size, key_col, cols, output_col, output_index, non_finite
        )

    def score_examples(
        self,
        data: Any,
        include_regularization: bool = False,
        batch_size: int = _ev.DEFAULT_BATCH_SIZE,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        score_col: str = "score",
        columns: Columns | None = None,
    ) -> Any:
        """Each example's loss (plus the L2 term when ``include_regularization``): ``RDD[float]`` for an RDD (or
        paths on a classic session); the DataFrame plus ``score_col`` for a DataFrame; ``path, example, score``
        rows for paths on Spark Connect."""
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner="score_examples")
        return _inf.score_examples(self.spark, self.network, data, include_regularization, batch_size, cols, score_col)

    def score_examples_with_key(
        self,
        data: Any,
        include_regularization: bool = False,
        batch_size: int = _ev.DEFAULT_BATCH_SIZE,
        key_col: str = "key",
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        score_col: str = "score",
        columns: Columns | None = None,
    ) -> Any:
        """``RDD[(key, DataSet)] -> RDD[(key, loss)]`` for single-example DataSets (or (features, labels)); a
        DataFrame with ``key_col`` gives a DataFrame ``key_col, score_col``."""
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner="score_examples_with_key")
        return _inf.score_examples_with_key(
            self.spark, self.network, data, include_regularization, batch_size, key_col, cols, score_col
        )

    def calculate_score(
        self,
        data: Any,
        average: bool = True,
        batch_size: int = _ev.DEFAULT_BATCH_SIZE,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        columns: Columns | None = None,
    ) -> float:
        """The loss over all of ``data``: the mean per example (``average=True``) or the sum."""
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner="calculate_score")
        return float(_inf.calculate_score(self.spark, self.network, data, average, batch_size, cols))

    def predict(
        self,
        dataframe: Any,
        features_col: FeaturesCol = "features",
        output_col: str = "prediction",
        feature_shape: Any = None,
        batch_size: int = 1024,
        output: str = "probabilities",
        output_index: int = 0,
        non_finite: str = "error",
        columns: Columns | None = None,
    ) -> Any:
        """``dataframe`` plus ``output_col`` from a batched Arrow UDF that builds the network once per Python
        worker. ``output="probabilities"`` gives ``array<float>``; ``"class"`` gives the argmax as ``bigint``.
        A list of ``features_col`` feeds a network with several inputs; ``output_index`` picks the output.
        A row whose features (or outputs) hold NaN or inf never gets a prediction silently: ``non_finite="error"``
        (default) fails the action with DataError naming the column and the row, ``"null"`` writes a null
        prediction for it (see `torchspark.spark.inference.predict`)."""
        cols = Columns.of(columns, features_col, "label", feature_shape, owner="predict")
        return _inf.predict(
            self.spark, self.network, dataframe, cols, output_col, batch_size, output, output_index, non_finite
        )
