"""The early-stopping loop (DL4J's ``BaseEarlyStoppingTrainer``), the same for Spark and ParallelWrapper.

[`run_early_stopping`][torchspark.earlystopping.run_early_stopping] trains one epoch at a time through a ``fit_epoch`` callable (one
``SparkNetwork.fit(data, epochs=1)`` or ``ParallelWrapper.fit(data, epochs=1)``) and after each epoch

  1. asks the iteration conditions about the epoch's training score and the elapsed time (live worker reports
     were asked during the epoch; a condition that fired there ends the run now);
  2. on an evaluation epoch, computes the score with the configuration's calculator and records it; a score better
     than every earlier one makes this the best model (saved by the model saver); ``save_last_model`` saves the
     latest too;
  3. tells the listener;
  4. asks the epoch conditions (score-based ones decide only on evaluated epochs).
A failing epoch or score ends the run with reason ``ERROR`` and the best model so far, as DL4J does.
"""

from __future__ import annotations

import abc
import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchspark.earlystopping.conditions import (
    EpochTerminationCondition,
    IterationTerminationCondition,
    MaxEpochs,
    MaxTime,
)
from torchspark.earlystopping.savers import InMemoryModelSaver
from torchspark.earlystopping.scores import ScoreCalculator
from torchspark.errors import ConfigError
from torchspark.nn import Network
from torchspark.training.hooks import ProgressUpdate
from torchspark.validation import check_bool, check_int

__all__ = [
    "EarlyStoppingConfiguration",
    "EarlyStoppingResult",
    "EarlyStoppingListener",
    "TerminationReason",
    "run_early_stopping",
    "LiveChecks",
    "EpochByEpochTrainer",
    "UNBOUNDED_EPOCH_LIMIT",
]

log = logging.getLogger(__name__)

#: epochs a run without MaxEpochs or MaxTime stops after (the other conditions may never fire: InvalidScore alone
#: on a healthy fit, NoImprovement on a score that keeps improving by a hair)
UNBOUNDED_EPOCH_LIMIT = 1000


class TerminationReason(str, enum.Enum):
    """Why a run ended (DL4J's ``EarlyStoppingResult.TerminationReason``)."""

    EPOCH_CONDITION = "epoch_condition"
    ITERATION_CONDITION = "iteration_condition"
    ERROR = "error"


@dataclass(frozen=True)
class EarlyStoppingConfiguration:
    """How to stop early (DL4J's ``EarlyStoppingConfiguration``).

    Args:
        score_calculator: what to measure after an epoch: a loss or a metric on validation data
            ([`LossCalculator`][torchspark.earlystopping.LossCalculator], ``EvaluationCalculator``; on Spark
            ``SparkLossCalculator`` / ``SparkEvaluationCalculator``). Required: the training score is a poor guide,
            it is measured on the data being fitted.
        epoch_conditions: checked after every epoch (``MaxEpochs``, ``NoImprovement``, ``ScoreTarget``).
        iteration_conditions: checked on training scores and elapsed time (``MaxTime``, ``MaxScore``,
            ``InvalidScore``). At least one condition of either kind is required; include ``MaxEpochs`` or
            ``MaxTime`` so that the run is bounded: without either it stops after
            `UNBOUNDED_EPOCH_LIMIT` epochs (reason ``EPOCH_CONDITION``, the details say why).
        model_saver: where the best model goes (default: [`InMemoryModelSaver`][torchspark.earlystopping.InMemoryModelSaver]).
        save_last_model: also save the model after every evaluated epoch (``saver.latest()``).
        evaluate_every_n_epochs: compute the score every N epochs (1 = every epoch). Raise it when validation is
            costly compared with an epoch; score-based conditions then decide every N epochs.
    """

    score_calculator: ScoreCalculator
    epoch_conditions: Sequence[EpochTerminationCondition] = ()
    iteration_conditions: Sequence[IterationTerminationCondition] = ()
    model_saver: Any = field(default_factory=InMemoryModelSaver)
    save_last_model: bool = False
    evaluate_every_n_epochs: int = 1

    def __post_init__(self) -> None:
        calc = self.score_calculator
        if not callable(getattr(calc, "calculate", None)) or not isinstance(getattr(calc, "minimize", None), bool):
            raise ConfigError(
                f"score_calculator must have calculate(network) and a bool minimize (e.g. "
                f"LossCalculator(validation_data)), got {type(calc).__name__}"
            )
        object.__setattr__(self, "epoch_conditions", tuple(self.epoch_conditions))
        object.__setattr__(self, "iteration_conditions", tuple(self.iteration_conditions))
        for c in self.epoch_conditions:
            if not isinstance(c, EpochTerminationCondition):
                raise ConfigError(
                    f"epoch_conditions holds {c!r}, not an epoch condition (MaxEpochs, NoImprovement, "
                    "ScoreTarget); iteration conditions go in iteration_conditions"
                )
        for ic in self.iteration_conditions:
            if not isinstance(ic, IterationTerminationCondition):
                raise ConfigError(
                    f"iteration_conditions holds {ic!r}, not an iteration condition (MaxTime, MaxScore, InvalidScore)"
                )
        if not self.epoch_conditions and not self.iteration_conditions:
            raise ConfigError(
                "early stopping needs at least one termination condition; add e.g. "
                "epoch_conditions=[MaxEpochs(20), NoImprovement(5)]"
            )
        for name in ("save_best", "save_latest", "best", "latest"):
            if not callable(getattr(self.model_saver, name, None)):
                raise ConfigError(
                    f"model_saver must be an InMemoryModelSaver, a DirectoryModelSaver or have "
                    f"{name}(); got {type(self.model_saver).__name__}"
                )
        check_bool("save_last_model", self.save_last_model)
        check_int("evaluate_every_n_epochs", self.evaluate_every_n_epochs, 1)

    def evaluates(self, epoch: int) -> bool:
        """Whether the score is computed after ``epoch`` (0-based): epochs N-1, 2N-1, ... (every epoch for N=1)."""
        return (epoch + 1) % self.evaluate_every_n_epochs == 0


@dataclass
class EarlyStoppingResult:
    """What an early-stopping run gives back (DL4J's ``EarlyStoppingResult``).

    Epochs are numbered from 0, as in DL4J. ``score_vs_epoch`` holds the evaluated epochs only;
    ``train_score_vs_epoch`` each epoch's training score (the fit's ``score``).
    """

    termination_reason: TerminationReason
    termination_details: str
    score_vs_epoch: dict[int, float]
    train_score_vs_epoch: dict[int, float]
    best_epoch: int
    best_score: float
    total_epochs: int
    best_model: Network | None

    def __str__(self) -> str:
        return (
            f"EarlyStoppingResult(reason={self.termination_reason.value}, details={self.termination_details!r}, "
            f"total_epochs={self.total_epochs}, best_epoch={self.best_epoch}, best_score={self.best_score:.6g})"
        )


class EarlyStoppingListener:
    """Called on the driver as the run goes (DL4J's ``EarlyStoppingListener``); override what you need."""

    def on_start(self, config: EarlyStoppingConfiguration, network: Network) -> None:
        return None

    def on_epoch(self, epoch: int, score: float | None, config: EarlyStoppingConfiguration, network: Network) -> None:
        """``score`` is None on epochs that were not evaluated."""
        return None

    def on_completion(self, result: EarlyStoppingResult) -> None:
        return None


class LiveChecks:
    """Iteration conditions asked on every live worker report (a progress listener, on a driver thread) and on each
    epoch's training score; the first one that fires is kept, and the run ends when the epoch under way ends."""

    def __init__(
        self, conditions: Sequence[IterationTerminationCondition], start: float, clock: Callable[[], float]
    ) -> None:
        self._conditions, self._start, self._clock = conditions, start, clock
        self._lock = threading.Lock()
        self.fired: str | None = None

    def __call__(self, update: ProgressUpdate) -> None:
        self.check(update.score, f"worker {update.rank}'s score {update.score:.6g} at iteration {update.iteration}")

    def check(self, score: float, where: str) -> str | None:
        """Ask every condition about ``score`` now; returns the first firing's description (kept), else None."""
        elapsed = self._clock() - self._start
        for c in self._conditions:
            if c.terminate(score, elapsed):
                with self._lock:
                    if self.fired is None:
                        self.fired = f"{c!r} fired on {where} after {elapsed:.1f} s"
                return self.fired
        return None


def run_early_stopping(
    config: EarlyStoppingConfiguration,
    network: Network,
    fit_epoch: Callable[[], float],
    listener: EarlyStoppingListener | None = None,
    live: LiveChecks | None = None,
    clock: Callable[[], float] = time.monotonic,
    start: float | None = None,
) -> EarlyStoppingResult:
    """Run the loop of the module docstring.

    Args:
        config: the early-stopping configuration.
        network: the network ``fit_epoch`` trains in place (the calculator scores it).
        fit_epoch: trains one epoch and returns its training score.
        listener: told about start, every epoch and completion.
        live: the iteration checks fed by the trainer's progress listener (None: only after each epoch).
        clock, start: the time source and the run's start (tests pass a fake clock).
    """
    listener = listener or EarlyStoppingListener()
    start = clock() if start is None else start
    live = live or LiveChecks(config.iteration_conditions, start, clock)
    saver, minimize = config.model_saver, config.score_calculator.minimize
    scores: dict[int, float] = {}
    train_scores: dict[int, float] = {}
    best_epoch, best_score = -1, math.nan
    bounded = any(isinstance(c, (MaxEpochs, MaxTime)) for c in (*config.epoch_conditions, *config.iteration_conditions))
    if not bounded:
        log.warning(
            "early stopping: no MaxEpochs or MaxTime condition; the run stops after %d epochs at most",
            UNBOUNDED_EPOCH_LIMIT,
        )
    listener.on_start(config, network)
    epoch = 0
    while True:
        try:
            train_scores[epoch] = train_score = float(fit_epoch())
            fired = live.fired or live.check(train_score, f"the training score {train_score:.6g} of epoch {epoch}")  # 1
            score: float | None = None
            if fired is None and config.evaluates(epoch):  # 2
                score = scores[epoch] = float(config.score_calculator.calculate(network))
                if not math.isnan(score) and (best_epoch < 0 or _improves(score, best_score, minimize)):
                    best_epoch, best_score = epoch, score
                    saver.save_best(network, epoch, score)
                if config.save_last_model:
                    saver.save_latest(network, epoch, score)
        except Exception as e:  # DL4J ends the run with reason Error and keeps the best model so far
            log.exception("early stopping: epoch %d failed", epoch)
            reason, details = TerminationReason.ERROR, f"{type(e).__name__}: {e}"
            break
        if fired is not None:
            reason, details = TerminationReason.ITERATION_CONDITION, fired
            break
        log.info(
            "early stopping: epoch %d, training score %.6g, score %s (best %.6g at epoch %d)",
            epoch,
            train_score,
            "not evaluated" if score is None else f"{score:.6g}",
            best_score,
            best_epoch,
        )
        listener.on_epoch(epoch, score, config, network)  # 3
        stop = next((c for c in config.epoch_conditions if c.terminate(epoch, scores, minimize)), None)  # 4
        if stop is not None:
            reason, details = TerminationReason.EPOCH_CONDITION, f"{stop!r} at epoch {epoch}"
            break
        if not bounded and epoch + 1 >= UNBOUNDED_EPOCH_LIMIT:
            reason, details = (
                TerminationReason.EPOCH_CONDITION,
                (
                    f"no condition fired in {UNBOUNDED_EPOCH_LIMIT} epochs and none bounds the run: stopped at the "
                    "limit (UNBOUNDED_EPOCH_LIMIT); add MaxEpochs(n) or MaxTime(seconds) to the conditions"
                ),
            )
            break
        epoch += 1
    result = EarlyStoppingResult(reason, details, scores, train_scores, best_epoch, best_score, epoch + 1, saver.best())
    log.info("early stopping ended: %s", result)
    listener.on_completion(result)
    return result


class EpochByEpochTrainer(abc.ABC):
    """What an adapter's early-stopping trainer shares with the others (``SparkEarlyStoppingTrainer``,
    ``EarlyStoppingParallelTrainer``): one progress listener, registered on the adapter once, that feeds the running
    fit's `LiveChecks`, and [`fit`][torchspark.earlystopping.trainer.EpochByEpochTrainer.fit]. A subclass says which network it trains and how one epoch runs.

    Args:
        config: the early-stopping configuration.
        listener: told about start, every epoch and completion.
        add_progress_listener: the adapter's ``add_progress_listener``.
    """

    def __init__(
        self,
        config: EarlyStoppingConfiguration,
        listener: EarlyStoppingListener | None,
        add_progress_listener: Callable[[Callable[[ProgressUpdate], None]], None],
    ) -> None:
        self.config, self.listener = config, listener
        self._live: LiveChecks | None = None
        add_progress_listener(self._on_progress)

    @property
    @abc.abstractmethod
    def network(self) -> Network:
        """The network the epochs train in place (the calculator scores it)."""

    @abc.abstractmethod
    def _fit_epoch(self) -> float:
        """Train one epoch; returns its training score (the adapter's score of the fit)."""

    def _on_progress(self, update: ProgressUpdate) -> None:
        live = self._live
        if live is not None:
            live(update)

    def fit(self) -> EarlyStoppingResult:
        """Run until a termination condition fires; returns the result (best model, scores, reason)."""
        check = getattr(self.config.model_saver, "check", None)
        if callable(check):
            check(self.network)
        start = time.monotonic()
        self._live = LiveChecks(self.config.iteration_conditions, start, time.monotonic)
        try:
            return run_early_stopping(
                self.config, self.network, self._fit_epoch, self.listener, live=self._live, start=start
            )
        finally:
            self._live = None


def _improves(score: float, best: float, minimize: bool) -> bool:
    return score < best if minimize else score > best
