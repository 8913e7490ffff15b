"""The Spark ML Params of ``TorchEstimator`` / ``TorchModel``, and the plain settings they turn into.

Params live only at the edge (pyspark's convention): ``_fit`` reads them once into a frozen `FitSettings`
(validated there, with messages naming the param) and the training code never sees a Param.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol

from torchspark.errors import ConfigError
from torchspark.nn import Network
from torchspark.nn.network_spec import NetworkSpec, is_import_path
from torchspark.nn.trust import import_path_of
from torchspark.optim import UpdaterSpec
from torchspark.training.config.masters import ParameterAveragingTrainingMaster, TrainingMaster, master_from_json
from torchspark.validation import check_int

__all__ = ["TorchModelParams", "TorchEstimatorParams", "FitSettings", "DEFAULT_MASTER_JSON", "network_param"]

#: the default ``trainingMaster``: synchronous parameter averaging with DL4J's defaults
DEFAULT_MASTER_JSON = ParameterAveragingTrainingMaster().to_json()


class TorchModelParams(HasFeaturesCol, HasPredictionCol, HasProbabilityCol):
    """Params a fitted model uses: where the features are and where the outputs go."""

    featureShape: Param[list[int]] = Param(
        Params._dummy(),
        "featureShape",
        "shape of one example, e.g. [1, 28, 28] for a CNN; [] = the flat array or vector as it is",
        typeConverter=TypeConverters.toListInt,
    )
    inferenceBatchSize: Param[int] = Param(
        Params._dummy(),
        "inferenceBatchSize",
        "examples per forward pass in transform (1024 suits small networks; lower it for large ones)",
        typeConverter=TypeConverters.toInt,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(featureShape=[], inferenceBatchSize=1024)

    def getFeatureShape(self) -> list[int]:
        return self.getOrDefault(self.featureShape)

    def getInferenceBatchSize(self) -> int:
        return self.getOrDefault(self.inferenceBatchSize)


class TorchEstimatorParams(TorchModelParams, HasLabelCol):
    """Params of training: the network, the training master, epochs, and the tunable learning rate and batch size."""

    network: Param[str] = Param(
        Params._dummy(),
        "network",
        'the network: a spec as JSON ({"model": "mlp", "kwargs": {...}, "loss": ..., "updater": ...}; "model" '
        "is a zoo name or a module class/factory path 'pkg.mod:MyNet'), a module class or factory's import path "
        "'pkg.mod:factory' (built with no arguments), or the path of a saved torchspark network (Network.save)",
        typeConverter=TypeConverters.toString,
    )
    trainingMaster: Param[str] = Param(
        Params._dummy(),
        "trainingMaster",
        "how to train, as a training master's JSON (ParameterAveragingTrainingMaster / SharedTrainingMaster "
        ".to_json()); default: parameter averaging with its defaults",
        typeConverter=TypeConverters.toString,
    )
    epochs: Param[int] = Param(
        Params._dummy(), "epochs", "passes over the training data (>= 1)", typeConverter=TypeConverters.toInt
    )
    learningRate: Param[float] = Param(
        Params._dummy(),
        "learningRate",
        "replaces the updater's learning rate when set (tune it with ParamGridBuilder); unset = the network's own",
        typeConverter=TypeConverters.toFloat,
    )
    batchSize: Param[int] = Param(
        Params._dummy(),
        "batchSize",
        "examples per minibatch on each worker; unset = the master's batch_size_per_worker",
        typeConverter=TypeConverters.toInt,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(trainingMaster=DEFAULT_MASTER_JSON, epochs=1)

    def getNetwork(self) -> str:
        return self.getOrDefault(self.network)

    def getTrainingMaster(self) -> str:
        return self.getOrDefault(self.trainingMaster)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def getLearningRate(self) -> float:
        return self.getOrDefault(self.learningRate)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)


@dataclass(frozen=True)
class FitSettings:
    """Everything one fit needs, read from the Params once and validated."""

    network: str
    master: TrainingMaster
    epochs: int
    learning_rate: float | None
    features_col: str
    label_col: str
    feature_shape: tuple[int, ...] | None
    #: import path -> module class or factory the estimator was handed as a callable (allowed without trust_code)
    factories: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: import any module class or factory path the network param names
    trust_code: bool = False

    @classmethod
    def of(cls, params: TorchEstimatorParams) -> FitSettings:
        if not params.isDefined(params.network):
            raise ConfigError(
                "TorchEstimator: set the network param: a zoo spec JSON such as "
                '\'{"model": "mlp", "kwargs": {"n_in": 4, "hidden": 16, "n_out": 3}}\', a module class or '
                "factory (network=MyNet), or a saved network's path"
            )
        master = master_from_json(params.getTrainingMaster())
        if params.isDefined(params.batchSize):
            size = check_int("batchSize", params.getBatchSize(), 1, owner="TorchEstimator")
            master = dataclasses.replace(master, batch_size_per_worker=size)
        epochs = check_int("epochs", params.getEpochs(), 1, owner="TorchEstimator")
        lr = params.getLearningRate() if params.isDefined(params.learningRate) else None
        shape = tuple(params.getFeatureShape()) or None
        return cls(
            params.getNetwork(),
            master,
            epochs,
            lr,
            params.getFeaturesCol(),
            params.getLabelCol(),
            shape,
            factories=dict(getattr(params, "_factories", {})),
            trust_code=bool(getattr(params, "_trust_code", False)),
        )

    def build_network(self) -> Network:
        """A fresh network: the spec built (seeded), the module class or factory path called with no arguments, or
        the saved network loaded; ``learning_rate`` applied. A path of your code is imported only when it was
        handed over as a callable or with ``trustCode``.

        Raises:
            ConfigError: a bad spec, or code the estimator may not import (the message says what to pass).
        """
        text = self.network.strip()
        fix = (
            "hand the class or factory itself to the estimator (TorchEstimator(network=MyNet) or "
            "est.setNetwork(MyNet)), or est.setTrustCode(True) if you trust this param as you trust code"
        )
        if text.startswith("{"):
            return NetworkSpec.from_json(text).build(self.learning_rate, self.factories, self.trust_code, fix)
        if is_import_path(text) and not os.path.exists(text):
            return NetworkSpec(text).build(self.learning_rate, self.factories, self.trust_code, fix)
        net = Network.load(text, factories=self.factories, trust_code=self.trust_code)
        return net if self.learning_rate is None else _with_learning_rate(net, self.learning_rate)


def network_param(value: Any, factories: dict[str, Any]) -> Any:
    """The ``network`` param's value for ``value``: a module class or factory (a callable) becomes its import path,
    remembered in ``factories`` (allowed at fit without trustCode); anything else is returned as it is.

    Raises:
        ConfigError: a callable without an import path (a lambda, a function defined inside another).
    """
    if isinstance(value, str) or not callable(value):
        return value
    path = import_path_of(value)
    if "<" in path:
        raise ConfigError(
            f"TorchEstimator: network {path!r} cannot be named by an import path (a lambda or a function defined "
            "inside another); define the class or factory at the top level of a module the executors can import"
        )
    factories[path] = value
    return path


def _with_learning_rate(net: Network, lr: float) -> Network:
    """The loaded network with its updater's ``lr`` replaced (weights kept; updater state restarts)."""
    if not isinstance(net.updater, UpdaterSpec):
        raise ConfigError("learningRate needs an updater spec (torchspark.optim) in the saved network")
    if isinstance(lr, bool) or not lr > 0:
        raise ConfigError(f"TorchEstimator: learningRate must be > 0, got {lr!r}")
    out = Network(
        net.module,
        loss=net.losses if len(net.losses) > 1 else net.losses[0],
        updater=dataclasses.replace(net.updater, lr=float(lr)),  # type: ignore[call-arg]
        seed=None,
        weight_decay=net.weight_decay,
        gradient_clip=net.gradient_clip,
        l1=net.l1,
        memory_format=net.memory_format,
    )
    out.iteration, out.epoch = net.iteration, net.epoch
    return out
