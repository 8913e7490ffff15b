"""Updater specs: serializable descriptions of a PyTorch optimizer (DL4J calls them *updaters*).

A spec is a frozen dataclass that builds a ``torch.optim.Optimizer`` and round-trips through JSON, so a saved
network and every Spark worker rebuild exactly the same updater without pickle.

Tuning, in short: start with ``Adam(lr=1e-3)``; with plain ``SGD`` use ``lr`` around 0.01-0.1 and
``momentum=0.9`` once training is stable. Under gradient sharing the updater runs on each worker *before*
encoding, so the encoded values are steps (lr already applied), as in DL4J.

Learning rates: every spec's ``lr`` is a number or a [`torchspark.schedules`][torchspark.schedules] schedule (step, exponential,
inverse, poly, sigmoid, map; by iteration or epoch), e.g. ``Adam(lr=ExponentialSchedule(1e-3, gamma=0.9999))``.
The network sets the optimizer's learning rate from the schedule before every step; the schedule is part of the
spec's JSON, so it survives save/load and reaches every worker.

Regularisation: L2 is the network's ``weight_decay`` and L1 its ``l1`` (see [`Network`][torchspark.Network]).

Speed: ``SGD``, ``Adam``, ``AdamW`` and ``AdaGrad`` use PyTorch's *fused* kernels by default where PyTorch has one
for the parameters' device (CPU, CUDA, ...): one vectorized pass per parameter tensor instead of about ten tensor
operations, a large share of a small network's minibatch step (BENCHMARKS.md, "Measurements behind design choices"). Results equal the unfused loop up to float
rounding; pass ``fused=False`` for bit-for-bit agreement with a default ``torch.optim`` optimizer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Union

import torch

from torchspark.errors import ConfigError
from torchspark.schedules import Schedule, schedule_from_dict
from torchspark.validation import check_bool, check_float

__all__ = [
    "UpdaterSpec",
    "SGD",
    "Adam",
    "AdamW",
    "RMSprop",
    "AdaGrad",
    "updater_from_dict",
    "updater_to_json",
    "exact_json",
    "UPDATERS",
    "UpdaterLike",
    "LearningRate",
]

#: A fixed learning rate or a schedule evaluated before every step.
LearningRate = Union[float, Schedule]


def _check_positive(name: str, value: Any, cls: str) -> None:
    check_float(name, value, above=0, finite=True, owner=cls)


def _check_lr(value: Any, cls: str) -> None:
    if not isinstance(value, Schedule):
        _check_positive("lr", value, cls)


def _lr(value: LearningRate) -> float:
    """The learning rate to build the optimizer with (a schedule's value before the first step)."""
    return value.value(0, 0) if isinstance(value, Schedule) else float(value)


def _check_fused(value: Any, cls: str) -> None:
    check_bool("fused", value, allow_none=True, owner=cls, none_means="automatic")


def _fused_devices() -> frozenset[str]:
    """Device types with fused optimizer kernels in this torch (private helper; a conservative guess without it)."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return frozenset(_get_fused_kernels_supported_devices())
    except ImportError:  # pragma: no cover - older or newer torch without the helper
        return frozenset({"cpu", "cuda"})


def _use_fused(requested: bool | None, params: list[torch.nn.Parameter]) -> bool:
    """``requested`` when set; automatically: fused when every parameter is a floating tensor on a device with
    fused kernels (PyTorch refuses anything else)."""
    if requested is not None:
        return requested
    devices = _fused_devices()
    return bool(params) and all(p.device.type in devices and p.dtype.is_floating_point for p in params)


def _check_range(name: str, value: Any, lo: float, hi: float, cls: str) -> None:
    check_float(name, value, minimum=lo, below=hi, owner=cls)


@dataclass(frozen=True)
class UpdaterSpec:
    """Base class of the updater specs. Subclasses define ``build`` and register a name."""

    name: ClassVar[str] = ""

    def build(self, params: Iterable[torch.nn.Parameter], weight_decay: float = 0.0) -> torch.optim.Optimizer:
        raise NotImplementedError

    @property
    def lr_schedule(self) -> Schedule | None:
        """The learning-rate schedule, or None for a fixed rate."""
        lr = getattr(self, "lr", None)
        return lr if isinstance(lr, Schedule) else None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.lr_schedule is not None:
            d["lr"] = self.lr_schedule.to_dict()
        d["type"] = self.name
        return d


@dataclass(frozen=True)
class SGD(UpdaterSpec):
    """Stochastic gradient descent, optionally with (Nesterov) momentum.

    Args:
        lr: learning rate (or a schedule); 0.01-0.1 for most networks.
        momentum: 0 (off) or about 0.9; momentum smooths noisy minibatch gradients.
        nesterov: Nesterov momentum (needs ``momentum > 0``): the gradient is taken after the momentum step, which
            damps oscillation; DL4J's ``Nesterovs`` updater (its update rule is the same step rearranged).
        fused: PyTorch's fused kernel (see the module docstring): None picks it where available, False never.
    """

    name: ClassVar[str] = "sgd"
    lr: LearningRate = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    fused: bool | None = None

    def __post_init__(self) -> None:
        _check_fused(self.fused, "SGD")
        _check_lr(self.lr, "SGD")
        _check_range("momentum", self.momentum, 0.0, 1.0, "SGD")
        check_bool("nesterov", self.nesterov, owner="SGD")
        if self.nesterov and self.momentum <= 0:
            raise ConfigError("SGD: nesterov=True needs momentum > 0 (try momentum=0.9)")

    def build(self, params: Iterable[torch.nn.Parameter], weight_decay: float = 0.0) -> torch.optim.Optimizer:
        params = list(params)
        return torch.optim.SGD(
            params,
            lr=_lr(self.lr),
            momentum=self.momentum,
            nesterov=self.nesterov,
            weight_decay=weight_decay,
            fused=_use_fused(self.fused, params),
        )


@dataclass(frozen=True)
class Adam(UpdaterSpec):
    """Adam. ``lr=1e-3`` is a sane default; lower it if the loss turns NaN.

    Args:
        lr: learning rate (or a schedule).
        betas: decay rates of the first and second moment estimates.
        eps: added to the denominator for numerical stability.
        amsgrad: AMSGrad (DL4J's ``AMSGrad`` updater): divide by the running maximum of the second moment, so the
            step size never grows again; steadier when Adam's loss spikes late in training. Adds one
            params-sized tensor to the updater state.
        fused: PyTorch's fused kernel (see the module docstring): None picks it where available, False never.
    """

    name: ClassVar[str] = "adam"
    lr: LearningRate = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    amsgrad: bool = False
    fused: bool | None = None

    def __post_init__(self) -> None:
        _check_fused(self.fused, type(self).__name__)
        check_bool("amsgrad", self.amsgrad, owner=type(self).__name__)
        _check_lr(self.lr, type(self).__name__)
        _check_positive("eps", self.eps, type(self).__name__)
        betas = tuple(self.betas)
        if len(betas) != 2:
            raise ConfigError(f"{type(self).__name__}: betas must be two numbers, got {self.betas!r}")
        for b in betas:
            _check_range("betas", b, 0.0, 1.0, type(self).__name__)
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))

    def build(self, params: Iterable[torch.nn.Parameter], weight_decay: float = 0.0) -> torch.optim.Optimizer:
        params = list(params)
        return torch.optim.Adam(
            params,
            lr=_lr(self.lr),
            betas=self.betas,
            eps=self.eps,
            weight_decay=weight_decay,
            amsgrad=self.amsgrad,
            fused=_use_fused(self.fused, params),
        )


@dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay: the decay is the network's ``weight_decay`` (``Network(weight_decay=0.01)``
    is AdamW's usual value; with the network's default 0 this equals [`Adam`][torchspark.optim.Adam])."""

    name: ClassVar[str] = "adamw"

    def build(self, params: Iterable[torch.nn.Parameter], weight_decay: float = 0.0) -> torch.optim.Optimizer:
        params = list(params)
        return torch.optim.AdamW(
            params,
            lr=_lr(self.lr),
            betas=self.betas,
            eps=self.eps,
            weight_decay=weight_decay,
            amsgrad=self.amsgrad,
            fused=_use_fused(self.fused, params),
        )


@dataclass(frozen=True)
class RMSprop(UpdaterSpec):
    """RMSprop. ``lr`` around 1e-3; ``alpha`` is the decay of the squared-gradient average."""

    name: ClassVar[str] = "rmsprop"
    lr: LearningRate = 1e-3
    alpha: float = 0.99
    eps: float = 1e-8
    momentum: float = 0.0

    def __post_init__(self) -> None:
        _check_lr(self.lr, "RMSprop")
        _check_range("alpha", self.alpha, 0.0, 1.0, "RMSprop")
        _check_positive("eps", self.eps, "RMSprop")
        _check_range("momentum", self.momentum, 0.0, 1.0, "RMSprop")

    def build(self, params: Iterable[torch.nn.Parameter], weight_decay: float = 0.0) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(
            params, lr=_lr(self.lr), alpha=self.alpha, eps=self.eps, momentum=self.momentum, weight_decay=weight_decay
        )


@dataclass(frozen=True)
class AdaGrad(UpdaterSpec):
    """AdaGrad. ``lr`` around 0.01-0.1; the effective step shrinks as squared gradients accumulate.

    ``fused``: PyTorch's fused kernel (see the module docstring): None picks it where available, False never.
    """

    name: ClassVar[str] = "adagrad"
    lr: LearningRate = 0.01
    eps: float = 1e-10
    fused: bool | None = None

    def __post_init__(self) -> None:
        _check_fused(self.fused, "AdaGrad")
        _check_lr(self.lr, "AdaGrad")
        _check_positive("eps", self.eps, "AdaGrad")

    def build(self, params: Iterable[torch.nn.Parameter], weight_decay: float = 0.0) -> torch.optim.Optimizer:
        params = list(params)
        return torch.optim.Adagrad(
            params, lr=_lr(self.lr), eps=self.eps, weight_decay=weight_decay, fused=_use_fused(self.fused, params)
        )


_REGISTRY: dict[str, type[UpdaterSpec]] = {c.name: c for c in (SGD, Adam, AdamW, RMSprop, AdaGrad)}

#: The updaters by name (``"sgd"``, ``"adam"``, ...), read-only: the one list that specs' JSON, string updaters
#: (``Network(updater="adam")``) and the CLI's ``--updater`` choices are read from. A new updater is a spec class
#: above and one entry in ``_REGISTRY``.
UPDATERS: Mapping[str, type[UpdaterSpec]] = MappingProxyType(_REGISTRY)

#: What ``Network(updater=...)`` accepts: a spec, a registered name ("adam"), or a callable params -> optimizer.
UpdaterLike = Union[UpdaterSpec, str, Callable[..., torch.optim.Optimizer]]


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples as lists), to compare with a JSON round trip."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def exact_json(value: Any) -> Any | None:
    """``value`` through a JSON round trip when that gives it back exactly (tuples turn into lists), else None
    (a tensor, an integer dict key, an object)."""
    try:
        back = json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return None
    return back if back == _plain(value) else None


#: the ``"type"`` of a ``torch.optim`` optimizer factory's JSON form (see `updater_to_json`)
TORCH_UPDATER = "torch"


def updater_to_json(updater: Any) -> dict[str, Any] | None:
    """The JSON form of an updater: a spec's [`to_dict`][torchspark.optim.UpdaterSpec.to_dict], or for a
    ``functools.partial`` of a ``torch.optim`` optimizer class with JSON keyword arguments
    (``partial(torch.optim.AdamW, lr=1e-3)``) ``{"type": "torch", "optimizer": "AdamW", "kwargs": {...}}``;
    None for any other callable (it travels pickled in memory and is saved only with ``allow_pickle=True``)."""
    if isinstance(updater, UpdaterSpec):
        return updater.to_dict()
    if isinstance(updater, functools.partial) and not updater.args:
        func = updater.func
        name = getattr(func, "__name__", "")
        kwargs = exact_json(dict(updater.keywords))
        if (
            isinstance(func, type)
            and issubclass(func, torch.optim.Optimizer)
            and getattr(torch.optim, name, None) is func
            and kwargs is not None
        ):
            return {"type": TORCH_UPDATER, "optimizer": name, "kwargs": kwargs}
    return None


def updater_from_dict(d: dict[str, Any]) -> UpdaterSpec | Callable[..., torch.optim.Optimizer]:
    """Rebuild an updater from [`updater_to_json`][torchspark.optim.updater_to_json] output: a spec (a registry
    lookup by ``"type"``), or for ``"type": "torch"`` a ``functools.partial`` of the ``torch.optim`` class it names
    (looked up in ``torch.optim`` only: nothing is imported)."""
    if not isinstance(d, dict):
        raise ConfigError(f"an updater spec must be an object with a 'type' field, got {d!r}")
    d = dict(d)
    kind = d.pop("type", None)
    if kind == TORCH_UPDATER:
        name, kwargs = d.get("optimizer"), d.get("kwargs")
        cls = getattr(torch.optim, name, None) if isinstance(name, str) else None
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or not isinstance(kwargs, dict):
            raise ConfigError(
                f"a 'torch' updater must name a torch.optim optimizer class and its kwargs, got {d!r}; this torch "
                "may not have it"
            )
        return functools.partial(cls, **kwargs)
    cls = _REGISTRY.get(str(kind))
    if cls is None:
        raise ConfigError(f"unknown updater {kind!r}; choose one of {sorted(_REGISTRY)}")
    if "betas" in d:
        d["betas"] = tuple(d["betas"])
    if isinstance(d.get("lr"), dict):
        d["lr"] = schedule_from_dict(d["lr"])
    try:
        return cls(**d)
    except TypeError as e:
        raise ConfigError(f"bad options for updater {kind!r}: {e}") from e


def resolve_updater(updater: UpdaterLike) -> UpdaterSpec | Callable[..., torch.optim.Optimizer]:
    """A spec, a registry name with default options, or a callable; anything else is a ConfigError."""
    if isinstance(updater, UpdaterSpec):
        return updater
    if isinstance(updater, str):
        cls = _REGISTRY.get(updater.lower())
        if cls is None:
            raise ConfigError(f"unknown updater {updater!r}; choose one of {sorted(_REGISTRY)} or pass a spec")
        return cls()
    if callable(updater):
        return updater
    raise ConfigError(
        f"updater must be a torchspark.optim spec (e.g. SGD(lr=0.01)), a name or a callable, got {updater!r}"
    )
