"""A whole network (zoo architecture, loss, updater, seed) as a small JSON document, built without importing code.

What a Spark ML ``TorchEstimator`` stores in its ``network`` param, what a config file names::

    {"model": "mlp", "kwargs": {"n_in": 4, "hidden": 16, "n_out": 3},
     "loss": "cross_entropy", "updater": {"type": "adam", "lr": 0.001}, "seed": 0}

``model`` must be a zoo name ([`ZOO`][torchspark.models.ZOO]): the spec names architectures, it never names a module to import, so a
spec from an untrusted file cannot run code. Losses are limited to the named ones for the same reason.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from typing import Any

from torchspark._bounded import load_json
from torchspark.errors import ConfigError
from torchspark.nn.losses import LOSSES
from torchspark.nn.network import Network
from torchspark.nn.precision import PRECISIONS
from torchspark.nn.zoo import ZOO
from torchspark.optim import UpdaterSpec, updater_from_dict
from torchspark.validation import check_choice, check_float

__all__ = ["NetworkSpec", "ZOO"]


@dataclass(frozen=True)
class NetworkSpec:
    """A zoo network with its loss and updater.

    Args:
        model: a [`ZOO`][torchspark.models.ZOO] name (``"mlp"``, ``"lenet"``).
        kwargs: the zoo factory's arguments (``torchspark.models.mlp(n_in, hidden, n_out)`` ...).
        loss: a named loss (``"cross_entropy"``, ``"mse"``, ``"bce_with_logits"``).
        updater: a [`torchspark.optim`][torchspark.optim] spec as its ``to_dict()`` (default SGD(lr=0.01)).
        seed: weight initialisation seed (None: random each build).
        weight_decay, l1, gradient_clip, precision: as for [`Network`][torchspark.Network] (``precision``:
            ``"fp32"``, ``"bf16"`` or ``"fp16"``).
    """

    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    loss: str = "cross_entropy"
    updater: dict[str, Any] = field(default_factory=lambda: {"type": "sgd", "lr": 0.01})
    seed: int | None = 0
    weight_decay: float = 0.0
    l1: float = 0.0
    gradient_clip: float | None = None
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.model not in ZOO:
            raise ConfigError(f"network spec: unknown model {self.model!r}; choose one of {sorted(ZOO)}")
        if not isinstance(self.kwargs, dict):
            raise ConfigError(f"network spec: kwargs must be an object of the factory's arguments, got {self.kwargs!r}")
        check_choice("loss", self.loss, sorted(LOSSES), owner="network spec")
        check_choice("precision", self.precision, PRECISIONS, owner="network spec")
        if isinstance(self.updater, UpdaterSpec):
            object.__setattr__(self, "updater", self.updater.to_dict())
        updater_from_dict(self.updater)  # refuses an unknown type or bad options now

    def build(self, learning_rate: float | None = None) -> Network:
        """A fresh network; ``learning_rate`` (when given) replaces the updater's ``lr``."""
        try:
            module = ZOO[self.model](**self.kwargs)
        except TypeError as e:
            raise ConfigError(f"network spec: bad kwargs for model {self.model!r}: {e}") from e
        updater = updater_from_dict(self.updater)
        if learning_rate is not None:
            check_float("learning rate", learning_rate, above=0, finite=True)
            if isinstance(updater, functools.partial):  # a torch.optim optimizer's factory
                updater = functools.partial(updater.func, **{**updater.keywords, "lr": float(learning_rate)})
            else:
                updater = dataclasses.replace(updater, lr=float(learning_rate))  # type: ignore[type-var]
        return Network(
            module,
            loss=self.loss,
            updater=updater,
            seed=self.seed,
            weight_decay=self.weight_decay,
            l1=self.l1,
            gradient_clip=self.gradient_clip,
            precision=self.precision,
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> NetworkSpec:
        d = load_json(text, "the network spec", ConfigError)
        if not isinstance(d, dict):
            raise ConfigError(f"network spec must be a JSON object, got {text!r}")
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(
                f"network spec: unknown key(s) {unknown}; known: {[f.name for f in dataclasses.fields(cls)]}"
            )
        if "model" not in d:
            raise ConfigError(f"network spec needs a 'model' (one of {sorted(ZOO)}), got {text!r}")
        return cls(**d)
