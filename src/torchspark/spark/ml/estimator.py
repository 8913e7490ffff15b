"""``TorchEstimator`` / ``TorchModel``: torchspark training as a Spark ML Estimator and Model.

``fit(df)`` builds the network (a zoo spec or a saved network, see the ``network`` param), trains it with
[`SparkNetwork`][torchspark.spark.SparkNetwork] and the training master of the ``trainingMaster`` param (rows stream to the
workers through Arrow; nothing is collected on the driver) and returns a [`TorchModel`][torchspark.spark.ml.TorchModel]. ``transform(df)`` runs
the network in a batched Arrow UDF (`torchspark.spark.inference.predict`) and adds the Spark ML columns:

* classifiers (``cross_entropy``): ``predictionCol`` the argmax class as a double, ``probabilityCol`` the softmax
  as an ML Vector (what ``MulticlassClassificationEvaluator`` and ``BinaryClassificationEvaluator`` read);
* ``bce_with_logits``: ``predictionCol`` 1.0/0.0 at 0.5 (a Vector of them for several outputs), ``probabilityCol``
  the sigmoids as a Vector;
* regression (``mse``): ``predictionCol`` the output as a double (a Vector for several outputs); no probabilities.
Set a column param to ``""`` to leave that column out.

Both are MLWritable/MLReadable: the params as Spark's JSON metadata, a model's network beside it in torchspark's
format (``network/config.json`` + ``network/weights.safetensors``, no pickle), so a ``Pipeline`` holding a
TorchEstimator saves and loads like any other.

On a Spark Connect session both work in ``pyspark.ml.Pipeline`` (and ``PipelineModel``) as they are: they are
Python stages, which pyspark runs on the client without the JVM. ``fit`` trains through
[`SparkNetwork.fit`][torchspark.spark.SparkNetwork.fit]'s Connect route, ``transform`` adds the columns with
the same Arrow UDF, and ``save``/``write().overwrite()``/``load`` work: Spark writes and reads the params metadata on
the server (``overwrite`` clears the path there, as Connect's own writers do), the client writes and reads the
network through fsspec. So the path must name the same storage for both (an object store or a shared file system);
a local path only works when the client runs beside the server.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.util import (
    DefaultParamsReadable,
    DefaultParamsReader,
    DefaultParamsWritable,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)
from pyspark.sql import DataFrame

from torchspark._io import join
from torchspark.data import Columns
from torchspark.errors import ConfigError, DataError
from torchspark.nn import Network
from torchspark.spark.inference import predict
from torchspark.spark.ml.params import FitSettings, TorchEstimatorParams, TorchModelParams, network_param
from torchspark.spark.network import SparkNetwork
from torchspark.spark.session_kinds import is_connect_session

__all__ = ["TorchEstimator", "TorchModel"]

log = logging.getLogger(__name__)

NETWORK_DIR = "network"


class _OverwriteOnEitherSession(MLWriter):
    """``write().overwrite()`` on a classic or a Spark Connect session: pyspark's own overwrite asks the JVM, which
    a Connect client does not have; Connect's writers clear the path on the server instead, and so does this."""

    def _handleOverwrite(self, path: str) -> None:
        if is_connect_session(self.sparkSession):
            from pyspark.ml.connect.readwrite import RemoteMLWriter

            RemoteMLWriter.handleOverwrite(path, True)
        else:
            super()._handleOverwrite(path)


class _EstimatorWriter(_OverwriteOnEitherSession, DefaultParamsWriter):
    """The params metadata (Spark's ``DefaultParamsWriter``), overwritable on a Connect session too."""


class TorchEstimator(Estimator, TorchEstimatorParams, DefaultParamsWritable, DefaultParamsReadable):
    """Trains a torchspark network on a DataFrame (see the module docstring).

    Example::

        est = TorchEstimator(network=NetworkSpec("mlp", {"n_in": 4, "hidden": 16, "n_out": 3}).to_json(),
                             trainingMaster=ParameterAveragingTrainingMaster(batch_size_per_worker=32).to_json(),
                             epochs=5, featuresCol="scaled", labelCol="label")
        model = Pipeline(stages=[VectorAssembler(...), StandardScaler(...), est]).fit(train_df)

    ``featuresCol`` may be an ``array<float|double>`` or an ML Vector column; labels are class indices (ints or
    integral doubles, as ``StringIndexer`` writes) for ``cross_entropy``.

    Your own module: ``TorchEstimator(network=MyNet)`` (a class or a factory taking no arguments; the param holds
    its import path ``"pkg.mod:MyNet"``, and the executors must import it, as for any Spark job). A path given as
    a string, or read back from a saved estimator, is imported only with ``trustCode=True`` (or after
    ``setNetwork(MyNet)``). For arguments, a spec: ``network='{"model": "pkg.mod:MyNet", "kwargs": {...}}'``.
    """

    _input_kwargs: dict[str, Any]  # set by pyspark's @keyword_only on each call
    #: module classes and factories handed over as callables, by import path (allowed at fit without trustCode)
    _factories: dict[str, Any]
    _trust_code: bool = False

    @keyword_only
    def __init__(
        self,
        *,
        network: str | Callable[..., Any] | None = None,
        trainingMaster: str | None = None,
        epochs: int | None = None,
        learningRate: float | None = None,
        batchSize: int | None = None,
        featuresCol: str | None = None,
        labelCol: str | None = None,
        predictionCol: str | None = None,
        probabilityCol: str | None = None,
        featureShape: list[int] | None = None,
        inferenceBatchSize: int | None = None,
        trustCode: bool = False,
    ) -> None:
        super().__init__()
        self._factories = {}
        self._set(**self._own_kwargs(self._input_kwargs))

    def _own_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The Params among ``kwargs``, ``network`` as a string; ``trustCode`` (no Param: never saved, so a file
        cannot turn it on) set aside."""
        kwargs = dict(kwargs)
        if "trustCode" in kwargs:
            self.setTrustCode(kwargs.pop("trustCode"))
        if "network" in kwargs:
            kwargs["network"] = network_param(kwargs["network"], self._factories)
        return kwargs

    @keyword_only
    def setParams(
        self,
        *,
        network: str | Callable[..., Any] | None = None,
        trainingMaster: str | None = None,
        epochs: int | None = None,
        learningRate: float | None = None,
        batchSize: int | None = None,
        featuresCol: str | None = None,
        labelCol: str | None = None,
        predictionCol: str | None = None,
        probabilityCol: str | None = None,
        featureShape: list[int] | None = None,
        inferenceBatchSize: int | None = None,
        trustCode: bool | None = None,
    ) -> TorchEstimator:
        return self._set(**self._own_kwargs(self._input_kwargs))

    def setNetwork(self, value: str | Callable[..., Any]) -> TorchEstimator:
        """The network: a spec JSON, a saved network's path, or a module class or factory (see the class)."""
        return self._set(network=network_param(value, self._factories))

    def setTrustCode(self, value: bool) -> TorchEstimator:
        """Let the ``network`` param name any module class or factory path (imported at fit). Not a Param: it is
        never saved with the estimator, so a saved pipeline cannot turn it on."""
        if not isinstance(value, bool):
            raise ConfigError(f"TorchEstimator: trustCode must be True or False, got {value!r}")
        self._trust_code = value
        return self

    def setTrainingMaster(self, value: str) -> TorchEstimator:
        return self._set(trainingMaster=value)

    def setEpochs(self, value: int) -> TorchEstimator:
        return self._set(epochs=value)

    def setLearningRate(self, value: float) -> TorchEstimator:
        return self._set(learningRate=value)

    def setBatchSize(self, value: int) -> TorchEstimator:
        return self._set(batchSize=value)

    def write(self) -> MLWriter:
        return _EstimatorWriter(self)

    def _fit(self, dataset: DataFrame) -> TorchModel:
        if not isinstance(dataset, DataFrame):
            raise DataError(f"TorchEstimator.fit needs a Spark DataFrame, got {type(dataset).__name__}")
        settings = FitSettings.of(self)
        network = settings.build_network()
        spark_net = SparkNetwork(dataset.sparkSession, network, settings.master, progress=False)
        try:
            spark_net.fit(dataset, settings.epochs, settings.features_col, settings.label_col, settings.feature_shape)
        finally:
            spark_net.delete_temp_files()
        log.info(
            "TorchEstimator: trained %r for %d epoch(s), last score %.6g", network, settings.epochs, spark_net.score
        )
        model = TorchModel(network)
        self._copyValues(model)
        return model


class TorchModel(Model, TorchModelParams, MLWritable, MLReadable):
    """A trained network as a Spark ML Model (see the module docstring). ``model.network`` is the
    [`Network`][torchspark.Network] itself (evaluate it with ``SparkNetwork(spark, model.network).evaluate(df)``)."""

    def __init__(self, network: Network | None = None) -> None:
        super().__init__()
        if network is not None and not isinstance(network, Network):
            raise ConfigError(f"TorchModel needs a torchspark.Network, got {type(network).__name__}")
        self.network = network

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from pyspark.ml.functions import array_to_vector
        from pyspark.sql import functions as F

        if self.network is None:
            raise ConfigError("this TorchModel has no network; fit a TorchEstimator or load a saved model")
        net = self.network
        raw = f"__torchspark_output_{uuid.uuid4().hex[:8]}"
        shape = tuple(self.getFeatureShape()) or None
        out = predict(
            dataset.sparkSession,
            net,
            dataset,
            Columns(self.getFeaturesCol(), None, shape),
            raw,
            self.getInferenceBatchSize(),
            output="probabilities",
        )
        values = F.col(raw)
        loss, width = net.losses[0].name, _output_width(net)
        if loss == "cross_entropy" and width > 1:
            prediction = (F.array_position(values, F.array_max(values)) - 1).cast("double")
        elif loss in ("cross_entropy", "bce_with_logits"):  # sigmoid outputs: threshold at 0.5
            flags = F.transform(values, lambda v: F.when(v >= 0.5, 1.0).otherwise(0.0))
            prediction = flags[0] if width == 1 else array_to_vector(flags)
        else:
            prediction = values[0].cast("double") if width == 1 else array_to_vector(values)
        if self.getPredictionCol():
            out = out.withColumn(self.getPredictionCol(), prediction)
        if self.getProbabilityCol() and loss != "mse":
            out = out.withColumn(self.getProbabilityCol(), array_to_vector(values))
        return out.drop(raw)

    def write(self) -> MLWriter:
        return _TorchModelWriter(self)

    @classmethod
    def read(cls) -> _TorchModelReader:
        """The reader; ``TorchModel.read().module(MyNet(...)).load(path)`` for a network of your own module."""
        return _TorchModelReader()


def _output_width(net: Network) -> int:
    """Outputs of the (first) output layer: the length of the last parameter (the output layer's bias, or its
    weight's rows), which is what the zoo's networks end with."""
    last = list(net.module.parameters())[-1]
    return int(last.shape[0])


class _TorchModelWriter(_OverwriteOnEitherSession):
    """Spark's params metadata, then the network in torchspark's format under ``network/``."""

    def __init__(self, instance: TorchModel) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        if self.instance.network is None:
            raise ConfigError("cannot save a TorchModel without a network")
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession)
        self.instance.network.save(join(path, NETWORK_DIR), save_updater=False)


class _TorchModelReader(MLReader):
    """Reads a saved TorchModel; a network of your own module takes ``TorchModel.read().module(MyNet(...))``,
    ``.factories([MyNet])`` or ``.trustCode()`` first (as [`Network.load`][torchspark.Network.load]'s arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self._load_options: dict[str, Any] = {}

    def module(self, module: Any) -> _TorchModelReader:
        """Load the weights into ``module`` (built as it was saved) instead of building the one the file names."""
        self._load_options["module"] = module
        return self

    def factories(self, factories: Any) -> _TorchModelReader:
        """Module classes or factories the saved network may name (``[MyNet]``)."""
        self._load_options["factories"] = factories
        return self

    def trustCode(self, value: bool = True) -> _TorchModelReader:
        """Import any module class the saved network names (only for files you trust as code)."""
        self._load_options["trust_code"] = value
        return self

    def load(self, path: str) -> TorchModel:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        model = TorchModel(Network.load(join(path, NETWORK_DIR), **self._load_options))
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        return model
