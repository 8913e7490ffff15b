"""Learning-rate schedules (DL4J's ``ISchedule``): serializable specs an updater evaluates before every step.

Pass one as an updater's ``lr``: ``SGD(lr=StepSchedule(0.1, decay_rate=0.5, step=1000))``. Before each
minibatch the network sets the optimizer's learning rate to ``schedule.value(iteration, epoch)``, where
``iteration`` counts the minibatches the network has trained so far (0 for the first) and ``epoch`` the finished
epochs. Both counters are saved with the network and shipped to every worker, so a schedule continues where it
left off after ``Network.load`` and on Spark/ParallelWrapper workers; with parameter averaging a worker counts its
own minibatches, as in DL4J.

``unit`` chooses which counter ``t`` is: ``"iteration"`` (default) or ``"epoch"``.

============================  ===================================================  ==============================
schedule                      value at ``t``                                        DL4J class
============================  ===================================================  ==============================
``StepSchedule``              ``initial * decay_rate ** floor(t / step)``           ``StepSchedule``
``ExponentialSchedule``       ``initial * gamma ** t``                              ``ExponentialSchedule``
``InverseSchedule``           ``initial / (1 + gamma * t) ** power``                ``InverseSchedule``
``PolySchedule``              ``initial * max(0, 1 - t / max_iter) ** power``       ``PolySchedule``
``SigmoidSchedule``           ``initial / (1 + exp(-gamma * (t - step_size)))``     ``SigmoidSchedule``
``MapSchedule``               ``values[k]`` for the largest key ``k <= t``          ``MapSchedule``
``CosineSchedule``            cosine from ``initial`` to ``eta_min`` at ``t_max``   (PyTorch ``CosineAnnealingLR``)
``WarmupSchedule``            linear ramp, then ``then(t - warmup)``                 (PyTorch ``LinearLR`` first)
``OneCycleSchedule``          up to ``max_lr``, then down (one cycle)               (PyTorch ``OneCycleLR``)
============================  ===================================================  ==============================

``PolySchedule`` stays at 0 after ``max_iter`` (DL4J's formula would go negative or NaN there); ``CosineSchedule``
stays at ``eta_min`` after ``t_max`` (PyTorch's scheduler would climb back up) and ``OneCycleSchedule`` at its final
value after ``total_steps`` (PyTorch's raises). Within those ranges each equals PyTorch's scheduler of the same
name for the same base learning rate (tests/unit/test_lr_schedulers.py checks it step by step).

Warm-up then cosine, the usual recipe for transformers: ``WarmupSchedule(500, then=CosineSchedule(1e-3,
t_max=9500))``. Any ``torch.optim.lr_scheduler`` scheduler can be used instead through ``Network(lr_scheduler=...)``
(see [`Network`][torchspark.Network]).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from torchspark.errors import ConfigError
from torchspark.validation import check_bool, check_choice, check_float, check_int

__all__ = [
    "Schedule",
    "StepSchedule",
    "ExponentialSchedule",
    "InverseSchedule",
    "PolySchedule",
    "SigmoidSchedule",
    "MapSchedule",
    "CosineSchedule",
    "WarmupSchedule",
    "OneCycleSchedule",
    "SCHEDULES",
    "schedule_from_dict",
]

UNITS = ("iteration", "epoch")


def _check_number(cls: str, name: str, value: Any, *, positive: bool = False, minimum: float | None = None) -> None:
    check_float(name, value, above=0 if positive else None, minimum=minimum, finite=True, owner=cls)


@dataclass(frozen=True)
class Schedule:
    """Base class: ``initial`` value and the counter (``unit``) that drives it. Subclasses define ``_at(t)``."""

    name: ClassVar[str] = ""

    def _check_base(self, initial: float, unit: str) -> None:
        cls = type(self).__name__
        _check_number(cls, "initial", initial, positive=True)
        check_choice("unit", unit, UNITS, owner=cls)

    def value(self, iteration: int, epoch: int) -> float:
        """The scheduled value for the step after ``iteration`` minibatches and ``epoch`` finished epochs."""
        # each subclass declares ``unit`` as its dataclass field (a base field would come first and need a default)
        unit = getattr(self, "unit")  # noqa: B009
        return float(self._at(iteration if unit == "iteration" else epoch))

    def _at(self, t: int) -> float:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """``{"type": <name>, **fields}``; inverse of [`schedule_from_dict`][torchspark.optim.schedule_from_dict]."""
        return {"type": self.name, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class StepSchedule(Schedule):
    """Multiply by ``decay_rate`` every ``step`` units: ``initial * decay_rate ** floor(t / step)``.

    Args:
        initial: starting value (e.g. the learning rate 0.1).
        decay_rate: factor per step, usually 0.1-0.5.
        step: units between drops (e.g. 30 epochs with ``unit="epoch"``).
        unit: ``"iteration"`` or ``"epoch"``.
    """

    name: ClassVar[str] = "step"
    initial: float
    decay_rate: float
    step: float
    unit: str = "iteration"

    def __post_init__(self) -> None:
        self._check_base(self.initial, self.unit)
        _check_number("StepSchedule", "decay_rate", self.decay_rate, positive=True)
        _check_number("StepSchedule", "step", self.step, positive=True)

    def _at(self, t: int) -> float:
        return self.initial * self.decay_rate ** math.floor(t / self.step)


@dataclass(frozen=True)
class ExponentialSchedule(Schedule):
    """``initial * gamma ** t``; ``gamma`` slightly below 1 (0.99 per epoch, 0.9999 per iteration)."""

    name: ClassVar[str] = "exponential"
    initial: float
    gamma: float
    unit: str = "iteration"

    def __post_init__(self) -> None:
        self._check_base(self.initial, self.unit)
        _check_number("ExponentialSchedule", "gamma", self.gamma, positive=True)

    def _at(self, t: int) -> float:
        return self.initial * self.gamma**t


@dataclass(frozen=True)
class InverseSchedule(Schedule):
    """``initial / (1 + gamma * t) ** power`` (Caffe's "inv" policy); e.g. ``gamma=1e-4, power=0.75``."""

    name: ClassVar[str] = "inverse"
    initial: float
    gamma: float
    power: float
    unit: str = "iteration"

    def __post_init__(self) -> None:
        self._check_base(self.initial, self.unit)
        _check_number("InverseSchedule", "gamma", self.gamma, minimum=0.0)
        _check_number("InverseSchedule", "power", self.power)

    def _at(self, t: int) -> float:
        return self.initial / (1.0 + self.gamma * t) ** self.power


@dataclass(frozen=True)
class PolySchedule(Schedule):
    """``initial * (1 - t / max_iter) ** power`` down to 0 at ``max_iter`` (0 afterwards); ``power=1`` is linear."""

    name: ClassVar[str] = "poly"
    initial: float
    power: float
    max_iter: int
    unit: str = "iteration"

    def __post_init__(self) -> None:
        self._check_base(self.initial, self.unit)
        _check_number("PolySchedule", "power", self.power, positive=True)
        check_int("max_iter", self.max_iter, 1, owner="PolySchedule")

    def _at(self, t: int) -> float:
        return self.initial * max(0.0, 1.0 - t / self.max_iter) ** self.power


@dataclass(frozen=True)
class SigmoidSchedule(Schedule):
    """``initial / (1 + exp(-gamma * (t - step_size)))``: a smooth ramp (``gamma > 0``) or drop (``gamma < 0``)
    centred on ``step_size``."""

    name: ClassVar[str] = "sigmoid"
    initial: float
    gamma: float
    step_size: int
    unit: str = "iteration"

    def __post_init__(self) -> None:
        self._check_base(self.initial, self.unit)
        _check_number("SigmoidSchedule", "gamma", self.gamma)
        _check_number("SigmoidSchedule", "step_size", self.step_size, minimum=0)

    def _at(self, t: int) -> float:
        z = -self.gamma * (t - self.step_size)
        return 0.0 if z > 700 else self.initial / (1.0 + math.exp(z))  # exp overflows past ~709


@dataclass(frozen=True)
class MapSchedule(Schedule):
    """Piecewise constant: the value of the largest key ``<= t``. Keys are ints and must include 0.

    Example: ``MapSchedule({0: 0.1, 1000: 0.01, 5000: 0.001})``. JSON turns the keys into strings; they are
    converted back.
    """

    name: ClassVar[str] = "map"
    values: dict[int, float]
    unit: str = "iteration"

    def __post_init__(self) -> None:
        if not isinstance(self.values, dict) or not self.values:
            raise ConfigError(f"MapSchedule: values must be a non-empty dict {{t: value}}, got {self.values!r}")
        try:
            values = {int(k): float(v) for k, v in self.values.items()}
        except (TypeError, ValueError):
            raise ConfigError(f"MapSchedule: keys must be ints and values numbers, got {self.values!r}") from None
        if 0 not in values or min(values) < 0:
            raise ConfigError(
                f"MapSchedule: keys must be >= 0 and include 0 (the starting value), got {sorted(values)}"
            )
        for v in values.values():
            _check_number("MapSchedule", "every value", v, positive=True)
        if self.unit not in UNITS:
            raise ConfigError(f"MapSchedule: unit must be one of {list(UNITS)}, got {self.unit!r}")
        object.__setattr__(self, "values", dict(sorted(values.items())))

    def __hash__(self) -> int:  # the dict field would make the generated hash fail
        return hash((tuple(self.values.items()), self.unit))

    def _at(self, t: int) -> float:
        return next(v for k, v in reversed(self.values.items()) if k <= t)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.name, "values": {str(k): v for k, v in self.values.items()}, "unit": self.unit}


@dataclass(frozen=True)
class CosineSchedule(Schedule):
    """Cosine annealing from ``initial`` down to ``eta_min`` over ``t_max`` units, then ``eta_min``:
    ``eta_min + (initial - eta_min) * (1 + cos(pi * t / t_max)) / 2`` (PyTorch's ``CosineAnnealingLR`` up to
    ``t_max``).

    Args:
        initial: starting value (the learning rate).
        t_max: units until the value reaches ``eta_min`` (the fit's total steps, or epochs with ``unit="epoch"``).
        eta_min: final value, ``0 <= eta_min < initial``.
        unit: ``"iteration"`` or ``"epoch"``.

    Example: ``Adam(lr=CosineSchedule(1e-3, t_max=10_000))``.
    """

    name: ClassVar[str] = "cosine"
    initial: float
    t_max: int
    eta_min: float = 0.0
    unit: str = "iteration"

    def __post_init__(self) -> None:
        self._check_base(self.initial, self.unit)
        check_int("t_max", self.t_max, 1, owner="CosineSchedule", fix="the fit's total steps (or epochs)")
        check_float("eta_min", self.eta_min, minimum=0, below=self.initial, owner="CosineSchedule")

    def _at(self, t: int) -> float:
        if t >= self.t_max:
            return float(self.eta_min)
        return self.eta_min + (self.initial - self.eta_min) * (1 + math.cos(math.pi * t / self.t_max)) / 2


@dataclass(frozen=True)
class WarmupSchedule(Schedule):
    """Linear warm-up for ``warmup`` units, then ``then``: ``then(0) * (start_factor + (1 - start_factor) * t /
    warmup)`` for ``t < warmup``, then ``then(t - warmup)`` (PyTorch's ``SequentialLR([LinearLR(start_factor,
    total_iters=warmup), then], milestones=[warmup])``).

    Args:
        warmup: units of warm-up (>= 1).
        then: the schedule after the warm-up (its ``t`` starts at 0 when the warm-up ends), or a fixed value.
        start_factor: the first value as a fraction of ``then``'s first value, in ``[0, 1)``; 0 (default) starts
            at 0, as Hugging Face's warm-up schedules do.
        unit: ``"iteration"`` or ``"epoch"``; must match ``then``'s.

    Example: ``AdamW(lr=WarmupSchedule(500, then=CosineSchedule(1e-3, t_max=9_500)))``.
    """

    name: ClassVar[str] = "warmup"
    warmup: int
    then: Schedule | float
    start_factor: float = 0.0
    unit: str = "iteration"

    def __post_init__(self) -> None:
        check_int("warmup", self.warmup, 1, owner="WarmupSchedule")
        check_float("start_factor", self.start_factor, minimum=0, below=1, owner="WarmupSchedule")
        check_choice("unit", self.unit, UNITS, owner="WarmupSchedule")
        if isinstance(self.then, Schedule):
            then_unit = getattr(self.then, "unit")  # noqa: B009
            if then_unit != self.unit:
                raise ConfigError(
                    f"WarmupSchedule: unit={self.unit!r} but then={type(self.then).__name__} counts {then_unit!r}; "
                    "give both the same unit"
                )
        else:
            _check_number("WarmupSchedule", "then", self.then, positive=True)

    def _then(self, t: int) -> float:
        return self.then._at(t) if isinstance(self.then, Schedule) else float(self.then)

    def _at(self, t: int) -> float:
        if t < self.warmup:
            return self._then(0) * (self.start_factor + (1 - self.start_factor) * t / self.warmup)
        return self._then(t - self.warmup)

    def to_dict(self) -> dict[str, Any]:
        then = self.then.to_dict() if isinstance(self.then, Schedule) else self.then
        return {
            "type": self.name,
            "warmup": self.warmup,
            "then": then,
            "start_factor": self.start_factor,
            "unit": self.unit,
        }


@dataclass(frozen=True)
class OneCycleSchedule(Schedule):
    """The one-cycle policy (Smith & Topin), PyTorch's ``OneCycleLR`` for the learning rate: from
    ``max_lr / div_factor`` up to ``max_lr`` over the first ``pct_start`` of ``total_steps``, then down to
    ``max_lr / div_factor / final_div_factor``; ``three_phase`` comes back to the start first, as PyTorch's does.
    After ``total_steps`` the value stays at the last one (PyTorch's raises). Momentum is not cycled.

    Args:
        max_lr: the peak value.
        total_steps: units in the cycle (the fit's total steps).
        pct_start: fraction of the cycle spent rising, in ``(0, 1)``.
        anneal: ``"cos"`` or ``"linear"``.
        div_factor: ``max_lr / start value``; final_div_factor: ``start value / final value``.
        three_phase: PyTorch's three-phase variant.
        unit: ``"iteration"`` or ``"epoch"``.

    Example: ``SGD(lr=OneCycleSchedule(0.1, total_steps=1_000), momentum=0.9)``.
    """

    name: ClassVar[str] = "onecycle"
    max_lr: float
    total_steps: int
    pct_start: float = 0.3
    anneal: str = "cos"
    div_factor: float = 25.0
    final_div_factor: float = 1e4
    three_phase: bool = False
    unit: str = "iteration"

    def __post_init__(self) -> None:
        owner = "OneCycleSchedule"
        _check_number(owner, "max_lr", self.max_lr, positive=True)
        check_int("total_steps", self.total_steps, 2, owner=owner, fix="the fit's total steps")
        check_float("pct_start", self.pct_start, above=0, below=1, owner=owner)
        check_choice("anneal", self.anneal, ("cos", "linear"), owner=owner)
        _check_number(owner, "div_factor", self.div_factor, positive=True)
        _check_number(owner, "final_div_factor", self.final_div_factor, positive=True)
        check_bool("three_phase", self.three_phase, owner=owner)
        check_choice("unit", self.unit, UNITS, owner=owner)

    def _phases(self) -> list[tuple[float, float, float]]:
        """``(end_step, start value, end value)`` of each phase, as PyTorch's ``OneCycleLR`` builds them."""
        start = self.max_lr / self.div_factor
        low = start / self.final_div_factor
        up = float(self.pct_start * self.total_steps) - 1
        last = float(self.total_steps - 1)
        if self.three_phase:
            return [(up, start, self.max_lr), (2 * up, self.max_lr, start), (last, start, low)]
        return [(up, start, self.max_lr), (last, self.max_lr, low)]

    def _at(self, t: int) -> float:
        phases = self._phases()
        t = min(t, self.total_steps - 1)
        begin = 0.0
        for i, (end, lo, hi) in enumerate(phases):
            if t <= end or i == len(phases) - 1:
                pct = (t - begin) / (end - begin)
                if self.anneal == "cos":
                    return hi + (lo - hi) / 2.0 * (math.cos(math.pi * pct) + 1)
                return (hi - lo) * pct + lo
            begin = end
        raise AssertionError("unreachable")  # pragma: no cover


SCHEDULES: dict[str, type[Schedule]] = {
    cls.name: cls
    for cls in (
        StepSchedule,
        ExponentialSchedule,
        InverseSchedule,
        PolySchedule,
        SigmoidSchedule,
        MapSchedule,
        CosineSchedule,
        WarmupSchedule,
        OneCycleSchedule,
    )
}


def schedule_from_dict(data: dict[str, Any]) -> Schedule:
    """Rebuild a schedule from [`Schedule.to_dict`][torchspark.schedules.Schedule.to_dict] output.

    Raises:
        ConfigError: unknown ``type`` (the message lists the known ones) or bad fields.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"a schedule must be an object with a 'type' field, got {data!r}")
    fields = dict(data)
    kind = fields.pop("type", None)
    cls = SCHEDULES.get(str(kind))
    if cls is None:
        raise ConfigError(f"unknown schedule type {kind!r}; known: {sorted(SCHEDULES)}")
    if isinstance(fields.get("then"), dict):
        fields["then"] = schedule_from_dict(fields["then"])
    try:
        return cls(**fields)
    except TypeError as e:
        raise ConfigError(f"bad fields for schedule {kind!r}: {sorted(fields)} ({e})") from e
