"""Termination conditions of early stopping (DL4J's ``EpochTerminationCondition`` / ``IterationTerminationCondition``).

Every condition is a frozen, validated dataclass and a *pure decision*: it looks at values the trainer hands it and
returns True to stop. None keeps hidden state, so one configuration can drive many runs.

* Epoch conditions are asked after every epoch with the epoch number (0-based, as DL4J) and the history of scores
  computed so far (``{epoch: score}``, only the evaluated epochs). Score-based ones decide only on an epoch that
  was evaluated (``evaluate_every_n_epochs``).
* Iteration conditions are asked with a training score (a worker's minibatch loss, or the epoch's averaged score)
  and the seconds since training started. Neither ``SparkNetwork`` nor ``ParallelWrapper`` can stop a running fit,
  so a condition that fires during an epoch ends training when that epoch ends (DL4J on Spark checks them once
  per epoch, on the averaged score).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from torchspark.errors import ConfigError
from torchspark.validation import check_float, check_int

__all__ = [
    "EpochTerminationCondition",
    "IterationTerminationCondition",
    "MaxEpochs",
    "NoImprovement",
    "ScoreTarget",
    "MaxTime",
    "MaxScore",
    "InvalidScore",
    "condition_from_dict",
    "best_epoch",
]


def _check_number(cls: str, name: str, value: Any, minimum: float | None = None, integer: bool = False) -> None:
    if integer:
        check_int(name, value, None if minimum is None else int(minimum), owner=cls)
    else:
        check_float(name, value, minimum=minimum, finite=True, owner=cls)


def _better(score: float, than: float, minimize: bool, by: float = 0.0) -> bool:
    """``score`` improves on ``than`` by more than ``by`` (NaN never improves)."""
    if math.isnan(score):
        return False
    if math.isnan(than):
        return True
    return (than - score if minimize else score - than) > by


def best_epoch(history: Mapping[int, float], minimize: bool, min_improvement: float = 0.0) -> int:
    """The epoch whose score was the last to improve on every earlier one by more than ``min_improvement``
    (-1 when no finite score exists). Ties keep the earlier epoch, as DL4J's best-model rule does."""
    best, best_score = -1, math.nan
    for epoch in sorted(history):
        score = history[epoch]
        first = best < 0 and not math.isnan(score)
        if first or (best >= 0 and _better(score, best_score, minimize, min_improvement)):
            best, best_score = epoch, score
    return best


@dataclass(frozen=True)
class EpochTerminationCondition:
    """Asked after every epoch: stop now? Subclasses register a ``kind`` for [`condition_from_dict`][torchspark.earlystopping.condition_from_dict]."""

    kind: ClassVar[str] = ""

    def terminate(self, epoch: int, history: Mapping[int, float], minimize: bool) -> bool:
        """``epoch``: the epoch just trained (0-based); ``history``: ``{epoch: score}`` of the evaluated epochs,
        this one included when it was evaluated; ``minimize``: whether lower scores are better."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class IterationTerminationCondition:
    """Asked with every training score seen (live worker reports and each epoch's averaged score): stop?"""

    kind: ClassVar[str] = ""

    def terminate(self, score: float, elapsed_s: float) -> bool:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class MaxEpochs(EpochTerminationCondition):
    """Stop after ``max_epochs`` epochs (DL4J's MaxEpochsTerminationCondition). Always add one: it bounds the run."""

    kind: ClassVar[str] = "max_epochs"
    max_epochs: int

    def __post_init__(self) -> None:
        _check_number("MaxEpochs", "max_epochs", self.max_epochs, 1, integer=True)

    def terminate(self, epoch: int, history: Mapping[int, float], minimize: bool) -> bool:
        return epoch + 1 >= self.max_epochs


@dataclass(frozen=True)
class NoImprovement(EpochTerminationCondition):
    """Stop when the score has not improved by more than ``min_improvement`` for ``patience`` evaluated epochs
    (DL4J's ScoreImprovementEpochTerminationCondition).

    Args:
        patience: epochs without improvement to tolerate; 3-10 is usual (noisy scores need more).
        min_improvement: the smallest change that counts as an improvement (0 = any). Set it to the noise level of
            the score (e.g. 1e-3 for a loss around 0.1) so that jitter does not keep training alive.
    """

    kind: ClassVar[str] = "no_improvement"
    patience: int
    min_improvement: float = 0.0

    def __post_init__(self) -> None:
        _check_number("NoImprovement", "patience", self.patience, 1, integer=True)
        _check_number("NoImprovement", "min_improvement", self.min_improvement, 0)

    def terminate(self, epoch: int, history: Mapping[int, float], minimize: bool) -> bool:
        if epoch not in history:  # decide on evaluated epochs only
            return False
        best = best_epoch(history, minimize, self.min_improvement)
        return best >= 0 and epoch - best >= self.patience


@dataclass(frozen=True)
class ScoreTarget(EpochTerminationCondition):
    """Stop once the score is better than ``target``: below it when lower is better (a loss), above it otherwise
    (an accuracy). DL4J's BestScoreEpochTerminationCondition."""

    kind: ClassVar[str] = "score_target"
    target: float

    def __post_init__(self) -> None:
        _check_number("ScoreTarget", "target", self.target)

    def terminate(self, epoch: int, history: Mapping[int, float], minimize: bool) -> bool:
        score = history.get(epoch, math.nan)
        return _better(score, self.target, minimize)


@dataclass(frozen=True)
class MaxTime(IterationTerminationCondition):
    """Stop once ``seconds`` have passed since training started (DL4J's MaxTimeIterationTerminationCondition).
    Checked at every worker progress report and after each epoch; the epoch under way still finishes."""

    kind: ClassVar[str] = "max_time"
    seconds: float

    def __post_init__(self) -> None:
        _check_number("MaxTime", "seconds", self.seconds, 0)
        if self.seconds <= 0:
            raise ConfigError(f"MaxTime: seconds must be > 0, got {self.seconds!r}")

    def terminate(self, score: float, elapsed_s: float) -> bool:
        return elapsed_s >= self.seconds


@dataclass(frozen=True)
class MaxScore(IterationTerminationCondition):
    """Stop when a training score rises above ``max_score`` (divergence; DL4J's MaxScoreIterationTerminationCondition).
    NaN counts as above. Pick a value well above the initial loss (e.g. 10x ``ln(classes)`` for cross-entropy)."""

    kind: ClassVar[str] = "max_score"
    max_score: float

    def __post_init__(self) -> None:
        _check_number("MaxScore", "max_score", self.max_score)

    def terminate(self, score: float, elapsed_s: float) -> bool:
        return math.isnan(score) or score > self.max_score


@dataclass(frozen=True)
class InvalidScore(IterationTerminationCondition):
    """Stop when a training score is NaN or infinite (DL4J's InvalidScoreIterationTerminationCondition): the
    weights are then garbage, and later epochs cannot repair them."""

    kind: ClassVar[str] = "invalid_score"

    def terminate(self, score: float, elapsed_s: float) -> bool:
        return not math.isfinite(score)


_CONDITIONS: dict[str, type[EpochTerminationCondition] | type[IterationTerminationCondition]] = {
    c.kind: c for c in (MaxEpochs, NoImprovement, ScoreTarget, MaxTime, MaxScore, InvalidScore)
}


def condition_from_dict(d: Mapping[str, Any]) -> EpochTerminationCondition | IterationTerminationCondition:
    """Rebuild a condition from its ``to_dict()`` form."""
    options = dict(d)
    kind = options.pop("type", None)
    cls = _CONDITIONS.get(str(kind))
    if cls is None:
        raise ConfigError(f"unknown termination condition {kind!r}; known: {sorted(_CONDITIONS)}")
    try:
        return cls(**options)
    except TypeError as e:
        raise ConfigError(f"bad options for termination condition {kind!r}: {e}") from e
