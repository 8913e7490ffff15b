"""A whole network (zoo architecture, loss, updater, seed) as a small JSON document, built without importing code.

What a Spark ML ``TorchEstimator`` stores in its ``network`` param, what a config file names::

    {"model": "mlp", "kwargs": {"n_in": 4, "hidden": 16, "n_out": 3},
     "loss": "cross_entropy", "updater": {"type": "adam", "lr": 0.001}, "seed": 0}

``model`` is a zoo name ([`ZOO`][torchspark.models.ZOO]), or the import path of a module class or factory of yours
(``"mypkg.models:MyNet"``, called with ``kwargs``). A zoo name runs no code but torchspark's; an import path is
imported only when the caller allows it (``factories=[MyNet]``, or ``trust_code=True``), so a spec from an untrusted
file cannot run code. Losses are limited to the named ones for the same reason.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from torchspark._bounded import load_json
from torchspark.errors import ConfigError
from torchspark.nn.losses import LOSSES
from torchspark.nn.network import Network
from torchspark.nn.precision import PRECISIONS
from torchspark.nn.spec import import_object
from torchspark.nn.trust import ZOO_FACTORIES, Factories, code_policy
from torchspark.nn.zoo import ZOO
from torchspark.optim import UpdaterSpec, updater_from_dict
from torchspark.validation import check_choice, check_float

__all__ = ["NetworkSpec", "ZOO", "is_import_path", "resolve_factory"]

#: ``"package.module:attr"`` (dotted names both sides); a URL (``s3://...``) or a file path is not one
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def is_import_path(text: str) -> bool:
    """Whether ``text`` reads as ``"package.module:factory"`` (not a path or URL)."""
    return isinstance(text, str) and _IMPORT_PATH.fullmatch(text) is not None


def resolve_factory(
    path: str,
    factories: Factories = None,
    trust_code: bool = False,
    owner: str = "network spec",
    fix: str | None = None,
) -> Callable[..., Any]:
    """The module class or factory ``path`` names: a zoo path, one of ``factories`` (named by import path), or,
    with ``trust_code``, whatever it imports.

    Raises:
        ConfigError: the path is not allowed (nothing is imported; the message says what to pass), cannot be
            imported, or is not callable.
    """
    policy = code_policy(factories, trust_code)
    module, _, name = path.partition(":")
    if path in ZOO_FACTORIES:
        return ZOO[name]
    found = policy.factories.get(path)
    if found is None and not trust_code:
        raise ConfigError(
            f"{owner}: model {path!r} names code to import, which is not allowed here; "
            + (
                fix
                or f"pass the class or factory itself (factories=[{name}]), or trust_code=True if you trust this "
                "setting as you trust code"
            )
        )
    factory = found if found is not None else import_object(path)
    if not callable(factory):
        raise ConfigError(f"{owner}: model {path!r} is not a class or function, got {type(factory).__name__}")
    return factory


@dataclass(frozen=True)
class NetworkSpec:
    """A zoo network with its loss and updater.

    Args:
        model: a [`ZOO`][torchspark.models.ZOO] name (``"mlp"``, ``"lenet"``), or the import path of a module class
            or factory of yours (``"mypkg.models:MyNet"``: built only when allowed, see `build`).
        kwargs: the zoo factory's (or your class's) arguments (``torchspark.models.mlp(n_in, hidden, n_out)`` ...).
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
        if self.model not in ZOO and not is_import_path(self.model):
            raise ConfigError(
                f"network spec: unknown model {self.model!r}; choose one of {sorted(ZOO)} or the import path "
                "'pkg.mod:factory' of a module class or factory of yours"
            )
        if not isinstance(self.kwargs, dict):
            raise ConfigError(f"network spec: kwargs must be an object of the factory's arguments, got {self.kwargs!r}")
        check_choice("loss", self.loss, sorted(LOSSES), owner="network spec")
        check_choice("precision", self.precision, PRECISIONS, owner="network spec")
        if isinstance(self.updater, UpdaterSpec):
            object.__setattr__(self, "updater", self.updater.to_dict())
        updater_from_dict(self.updater)  # refuses an unknown type or bad options now

    def build(
        self,
        learning_rate: float | None = None,
        factories: Factories = None,
        trust_code: bool = False,
        fix: str | None = None,
    ) -> Network:
        """A fresh network; ``learning_rate`` (when given) replaces the updater's ``lr``.

        Args:
            factories: module classes or factories an import-path ``model`` may name (``[MyNet]``).
            trust_code: import any ``model`` path (only for specs you trust as code).
            fix: what the refusal of a ``model`` path not allowed says to do (default: pass ``factories`` or
                ``trust_code``).
        Raises:
            ConfigError: an import-path ``model`` not allowed (see `resolve_factory`), bad kwargs, or a factory
                that does not return a ``torch.nn.Module``.
        """
        factory = ZOO[self.model] if self.model in ZOO else resolve_factory(self.model, factories, trust_code, fix=fix)
        try:
            module = factory(**self.kwargs)
        except TypeError as e:
            raise ConfigError(f"network spec: bad kwargs for model {self.model!r}: {e}") from e
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(
                f"network spec: model {self.model!r} returned {type(module).__name__}, expected a torch.nn.Module"
            )
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
            raise ConfigError(
                f"network spec needs a 'model' (one of {sorted(ZOO)}, or 'pkg.mod:factory'), got {text!r}"
            )
        return cls(**d)
