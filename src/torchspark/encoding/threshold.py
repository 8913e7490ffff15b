"""Threshold policies: the next threshold from the last step's sparsity (pure functions of an explicit state).

Each policy is a frozen, validated config with two methods:

* ``initial_state() -> ThresholdState`` - the state before the first step;
* ``next_threshold(state, last_sparsity) -> ThresholdState`` - the state for the next step, given the fraction of
  elements the last step sent (``EncodedUpdate.density``; 0 for an empty message).

The state is tiny (threshold and last sparsity), JSON- and tensor-serialisable, and can be averaged across workers
with [`average_states`][torchspark.encoding.average_states] at the end of a fit (DL4J's reducer) and carried into the next fit.

Calibrated start (the default of [`AdaptiveThreshold`][torchspark.encoding.AdaptiveThreshold] and [`TargetSparsityThreshold`][torchspark.encoding.TargetSparsityThreshold]). DL4J starts at
a fixed 1e-4, which is 10-100x too small for typical Adam/SGD steps: the first ~150 messages are dense bitmaps and
dominate the traffic of a short fit. With ``initial="calibrated"`` the policy's initial state has no threshold yet
(``threshold=None``); the first update picks it: [`calibrated_threshold`][torchspark.encoding.calibrated_threshold] finds the ``t`` at which that
update's magnitudes would give the policy's target sparsity, the workers agree on one value
([`agree_threshold`][torchspark.encoding.agree_threshold], the gradient-sharing loop gathers every worker's value once) and
`calibrated_state` clamps it to the policy's bounds. Pass a float as ``initial`` for DL4J's fixed start.

Unlike DL4J, a bitmap step is not assumed to have sparsity 1/16: the encoder always knows the real count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

import torch

from torchspark.errors import ConfigError
from torchspark.validation import check_float

__all__ = [
    "ThresholdState",
    "ThresholdPolicy",
    "FixedThreshold",
    "AdaptiveThreshold",
    "TargetSparsityThreshold",
    "THRESHOLD_POLICIES",
    "CALIBRATED",
    "average_states",
    "shake_up_threshold",
    "threshold_policy_from_dict",
    "NUM_SUMMANDS",
]

DEFAULT_DECAY = 0.5 ** (1 / 20)  # at most x2 per 20 steps (x100 in ~132, x1000 in ~200)

#: ``initial`` value that makes a policy calibrate its first threshold from the first update.
CALIBRATED = "calibrated"


@dataclass(frozen=True)
class ThresholdState:
    """Threshold for the next step and the sparsity the last step achieved (None before the first step).

    ``threshold`` is None while a calibrated start still waits for its first update (see the module docstring).
    """

    threshold: float | None
    last_sparsity: float | None = None

    @property
    def calibrated(self) -> bool:
        """True once the state has a threshold (always, for a fixed start)."""
        return self.threshold is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThresholdState:
        threshold, last = data.get("threshold"), data.get("last_sparsity")
        return cls(
            threshold=None if threshold is None else float(threshold),
            last_sparsity=None if last is None else float(last),
        )

    def to_tensor(self) -> torch.Tensor:
        """float64 tensor ``[threshold, last_sparsity]`` (NaN for None), for saving next to model weights."""
        threshold = math.nan if self.threshold is None else self.threshold
        last = math.nan if self.last_sparsity is None else self.last_sparsity
        return torch.tensor([threshold, last], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> ThresholdState:
        if t.numel() != 2:
            raise ConfigError(f"a threshold-state tensor has 2 values [threshold, last_sparsity], got {t.numel()}")
        threshold, last = (float(v) for v in t.reshape(-1).tolist())
        return cls(
            threshold=None if math.isnan(threshold) else threshold, last_sparsity=None if math.isnan(last) else last
        )


class ThresholdPolicy(Protocol):
    """What the encoder needs from a threshold policy.

    ``initial_state()`` has ``threshold=None`` exactly when ``calibration_target()`` is not None: the first update
    then chooses the threshold, aiming at that sparsity, and ``calibrated_state(t)`` is the state to start from.
    """

    def initial_state(self) -> ThresholdState: ...

    def calibration_target(self) -> float | None: ...

    def calibrated_state(self, threshold: float) -> ThresholdState: ...

    def next_threshold(self, state: ThresholdState, last_sparsity: float) -> ThresholdState: ...

    def to_dict(self) -> dict[str, Any]: ...


def _check_positive(name: str, value: float, hint: str) -> None:
    check_float(name, value, above=0, finite=True, fix=hint)


def _check_decay(value: float) -> None:
    check_float(
        "decay_rate",
        value,
        minimum=0.5,
        below=1,
        fix="the default 0.5**(1/20) ~ 0.966 changes the threshold by at most x2 per 20 steps",
    )


def _check_initial(value: float | str) -> None:
    if value == CALIBRATED:
        return
    if isinstance(value, (str, bool)):
        raise ConfigError(
            f"initial must be {CALIBRATED!r} (the default: chosen from the first update) or a "
            f"threshold > 0 such as DL4J's 1e-4, got {value!r}"
        )
    _check_positive("initial", value, f"use {CALIBRATED!r} (the default) or DL4J's 1e-4")


def _check_bounds(min_threshold: float, max_threshold: float, initial: float | str) -> None:
    _check_positive("min_threshold", min_threshold, "the default 1e-10 only guards against underflow")
    _check_positive("max_threshold", max_threshold, "the default 1e10 only guards against overflow")
    if min_threshold > max_threshold:
        raise ConfigError(f"min_threshold={min_threshold!r} must be <= max_threshold={max_threshold!r}")
    if initial != CALIBRATED and not min_threshold <= initial <= max_threshold:  # type: ignore[operator]
        raise ConfigError(
            f"initial threshold {initial!r} must lie in [min_threshold={min_threshold!r}, "
            f"max_threshold={max_threshold!r}]; widen the bounds or change the initial value"
        )


class _Serialisable:
    name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """``{"type": <registry name>, **fields}``; inverse of [`threshold_policy_from_dict`][torchspark.encoding.threshold_policy_from_dict]."""
        return {"type": self.name, **asdict(self)}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        fields = {k: v for k, v in data.items() if k != "type"}
        try:
            return cls(**fields)
        except TypeError as e:
            raise ConfigError(f"bad fields for threshold policy {cls.name!r}: {sorted(fields)} ({e})") from e


@dataclass(frozen=True)
class FixedThreshold(_Serialisable):
    """Always the same threshold.

    Args:
        threshold: step size; a common start for SGD-like updates is 1e-3. Too large sends nothing for many
            steps (training stalls), too small sends dense bitmaps (no compression).
    """

    name: ClassVar[str] = "fixed"
    threshold: float = 1e-3

    def __post_init__(self) -> None:
        _check_positive("threshold", self.threshold, "try 1e-3")

    def initial_state(self) -> ThresholdState:
        return ThresholdState(self.threshold)

    def calibration_target(self) -> float | None:
        """None: a fixed threshold is never calibrated."""
        return None

    def calibrated_state(self, threshold: float) -> ThresholdState:
        """The fixed threshold, whatever was calibrated."""
        return ThresholdState(self.threshold)

    def next_threshold(self, state: ThresholdState, last_sparsity: float) -> ThresholdState:
        return ThresholdState(self.threshold, last_sparsity)


class _StartMixin:
    """``initial_state`` / ``calibration_target`` / ``calibrated_state`` of the policies with a calibratable start."""

    initial: float | str
    min_threshold: float
    max_threshold: float

    def _target(self) -> float:
        raise NotImplementedError

    def initial_state(self) -> ThresholdState:
        """``ThresholdState(initial)``, or ``ThresholdState(None)`` (to be calibrated) for ``initial="calibrated"``."""
        return ThresholdState(None if self.initial == CALIBRATED else float(self.initial))

    def calibration_target(self) -> float | None:
        """The sparsity a calibrated start aims at; None for a fixed ``initial``."""
        return self._target() if self.initial == CALIBRATED else None

    def calibrated_state(self, threshold: float) -> ThresholdState:
        """The state to start from with a calibrated ``threshold``, kept in ``[min_threshold, max_threshold]``."""
        return ThresholdState(min(max(float(threshold), self.min_threshold), self.max_threshold))


@dataclass(frozen=True)
class AdaptiveThreshold(_StartMixin, _Serialisable):
    """DL4J's default: keep the sparsity of each message inside ``[min_target_sparsity, max_target_sparsity]``.

    Rule, once per step: last sparsity below the band -> ``t *= decay_rate`` (send more); above -> ``t /= decay_rate``
    (send less); inside -> unchanged. The threshold is kept in ``[min_threshold, max_threshold]``.

    Args:
        initial: first threshold. ``"calibrated"`` (default): chosen from the first update so that its magnitudes
            give the middle of the band, ``sqrt(min_target_sparsity * max_target_sparsity)`` (1e-3 with the
            defaults), agreed across workers (see [`calibrated_threshold`][torchspark.encoding.calibrated_threshold]). A float is DL4J's fixed start
            (DL4J: 1e-4): the policy then moves x2 per 20 steps, so a start 100x too small costs ~130 dense steps
            (LeNet on digits with Adam at lr=1e-3, 2 workers, 15 epochs: 1e-4 sent 54x fewer bytes than averaging
            every 5 steps where the calibrated start sent 362x fewer; BENCHMARKS.md, "Gradient sharing vs dense
            averaging").
        min_target_sparsity: lower edge of the band (fraction of elements sent per message).
        max_target_sparsity: upper edge; keep below 1/16 or messages become bitmaps.
        decay_rate: multiplicative step in [0.5, 1); closer to 1 = smoother but slower adaptation.
        min_threshold, max_threshold: hard bounds against underflow/overflow on all-zero or non-finite updates.
    """

    name: ClassVar[str] = "adaptive"
    initial: float | str = CALIBRATED
    min_target_sparsity: float = 1e-4
    max_target_sparsity: float = 1e-2
    decay_rate: float = DEFAULT_DECAY
    min_threshold: float = 1e-10
    max_threshold: float = 1e10

    def __post_init__(self) -> None:
        _check_initial(self.initial)
        _check_decay(self.decay_rate)
        _check_bounds(self.min_threshold, self.max_threshold, self.initial)
        if not 0 < self.min_target_sparsity <= self.max_target_sparsity < 1:
            raise ConfigError(
                f"need 0 < min_target_sparsity <= max_target_sparsity < 1, got "
                f"min_target_sparsity={self.min_target_sparsity!r}, "
                f"max_target_sparsity={self.max_target_sparsity!r}; the defaults are 1e-4 and 1e-2"
            )

    def _target(self) -> float:
        return math.sqrt(self.min_target_sparsity * self.max_target_sparsity)

    def next_threshold(self, state: ThresholdState, last_sparsity: float) -> ThresholdState:
        t = _require_threshold(state)
        if last_sparsity < self.min_target_sparsity:
            t *= self.decay_rate
        elif last_sparsity > self.max_target_sparsity:
            t /= self.decay_rate
        return ThresholdState(min(max(t, self.min_threshold), self.max_threshold), last_sparsity)


@dataclass(frozen=True)
class TargetSparsityThreshold(_StartMixin, _Serialisable):
    """Multiplicative steps toward a single sparsity target.

    Rule: last sparsity below ``target`` -> ``t *= decay_rate``; above -> ``t /= decay_rate``. The sparsity then
    oscillates within about one decay step around the target.

    Args:
        initial: first threshold: ``"calibrated"`` (default, chosen from the first update to give ``target``) or a
            float (DL4J's fixed start, 1e-4).
        target: fraction of elements to send per message, in (0, 1/16) so messages stay sparse. 1e-3 is a good
            start; Strom 2015 reports no accuracy loss at ~1e-3..1e-4 for speech models.
        decay_rate: multiplicative step in [0.5, 1).
        min_threshold, max_threshold: hard bounds, as in [`AdaptiveThreshold`][torchspark.encoding.AdaptiveThreshold].
    """

    name: ClassVar[str] = "target_sparsity"
    initial: float | str = CALIBRATED
    target: float = 1e-3
    decay_rate: float = DEFAULT_DECAY
    min_threshold: float = 1e-10
    max_threshold: float = 1e10

    def __post_init__(self) -> None:
        _check_initial(self.initial)
        _check_decay(self.decay_rate)
        _check_bounds(self.min_threshold, self.max_threshold, self.initial)
        if not (isinstance(self.target, (int, float)) and 0 < self.target < 1 / 16):
            raise ConfigError(
                f"target must be in (0, 1/16), got {self.target!r}; above 1/16 messages become "
                "bitmaps and compression is lost; try 1e-3"
            )

    def _target(self) -> float:
        return float(self.target)

    def next_threshold(self, state: ThresholdState, last_sparsity: float) -> ThresholdState:
        t = _require_threshold(state)
        if last_sparsity < self.target:
            t *= self.decay_rate
        elif last_sparsity > self.target:
            t /= self.decay_rate
        return ThresholdState(min(max(t, self.min_threshold), self.max_threshold), last_sparsity)


def _require_threshold(state: ThresholdState) -> float:
    if state.threshold is None:
        raise ConfigError(
            "the threshold state is not calibrated yet (threshold=None); calibrate it with "
            "policy.calibrated_state(calibrated_threshold(update, policy.calibration_target()))"
        )
    return state.threshold


THRESHOLD_POLICIES: dict[str, type[Any]] = {
    cls.name: cls for cls in (FixedThreshold, AdaptiveThreshold, TargetSparsityThreshold)
}


def threshold_policy_from_dict(data: dict[str, Any]) -> ThresholdPolicy:
    """Rebuild a policy from its `to_dict` form.

    Raises:
        ConfigError: unknown ``type`` (the message lists the known ones) or bad fields.
    """
    kind = data.get("type") if isinstance(data, dict) else None
    cls = THRESHOLD_POLICIES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigError(f"unknown threshold policy type {kind!r}; known: {sorted(THRESHOLD_POLICIES)}")
    policy: ThresholdPolicy = cls.from_dict(data)
    return policy


def average_states(states: Sequence[ThresholdState]) -> ThresholdState:
    """DL4J's end-of-fit reducer: mean threshold and mean last sparsity over the workers that stepped.

    A state whose ``last_sparsity`` is None never stepped (a worker without data in this fit: gradient sharing
    starts every fit's state without a sparsity) and is skipped entirely, so an idle worker's unchanged starting
    threshold does not drag the average back. When no worker stepped, the result is the mean of the (unchanged)
    thresholds with no sparsity, over the workers that have one (a calibrated start has none until the first
    update); None when no worker has a threshold.

    Raises:
        ConfigError: ``states`` is empty.
    """
    if not states:
        raise ConfigError("average_states needs at least one state, got none")
    sums = [sum(column) for column in zip(*(state_summands(s) for s in states))]
    return average_from_sums(sums, len(states))


def state_summands(state: ThresholdState) -> tuple[float, float, float, float, float]:
    """One worker's ``(threshold if stepped else 0, last sparsity if stepped else 0, 1 if stepped else 0,
    threshold if set else 0, 1 if set else 0)``, where "stepped" means it has a last sparsity and "set" that its
    threshold is not None (a calibrated start before its first update): summed over workers (by a list sum or an
    all-reduce), [`average_from_sums`][torchspark.encoding.average_from_sums] turns them into [`average_states`][torchspark.encoding.average_states]' result."""
    threshold, sparsity = state.threshold, state.last_sparsity
    if threshold is None:
        return (0.0, 0.0, 0.0, 0.0, 0.0)
    if sparsity is None:
        return (0.0, 0.0, 0.0, threshold, 1.0)
    return (threshold, sparsity, 1.0, threshold, 1.0)


#: how many values [`state_summands`][torchspark.encoding.state_summands] returns (the width of the all-reduced threshold summary)
NUM_SUMMANDS = 5


def average_from_sums(sums: Sequence[float], workers: int) -> ThresholdState:
    """[`average_states`][torchspark.encoding.average_states] from the sums over ``workers`` workers of their [`state_summands`][torchspark.encoding.state_summands]: the means
    over the workers that stepped, or the mean of the thresholds that are set when none did (None if none is)."""
    threshold, sparsity, stepped, threshold_all, with_threshold = (float(v) for v in sums)
    if not stepped:
        return ThresholdState(threshold=threshold_all / with_threshold if with_threshold else None)
    return ThresholdState(threshold=threshold / stepped, last_sparsity=sparsity / stepped)


def shake_up_threshold(threshold: float, step: int, shake_frequency: int, divisor: float = 3.0) -> float:
    """The threshold to encode with at ``step``: ``threshold / divisor`` on shake-up steps, else ``threshold``.

    Every ``shake_frequency`` steps (``step > 0 and step % shake_frequency == 0``; 0 = never) the encoder flushes
    residual entries above ``t/3`` as ``±t/3`` steps, so small residuals that never reach ``t`` do not starve.
    """
    if shake_frequency > 0 and step > 0 and step % shake_frequency == 0:
        return threshold / divisor
    return threshold
