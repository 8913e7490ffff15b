"""Independent per-output binary metrics for multi-label (sigmoid) outputs (DL4J's ``EvaluationBinary``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from torchspark.errors import ConfigError, DataError
from torchspark.evaluation._inputs import binary_labels, element_mask, output_probabilities, safe_divide
from torchspark.evaluation.base import BaseEvaluation
from torchspark.validation import check_int

__all__ = ["EvaluationBinary"]

_COUNTS = ("tp", "fp", "tn", "fn")


def _check_thresholds(value: float | Sequence[float], num_outputs: int | None) -> float | list[float]:
    """One float, or a list of floats (one per output), each in (0, 1)."""
    single = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        values = [float(cast(float, value))] if single else [float(v) for v in cast("Sequence[float]", value)]
    except (TypeError, ValueError):
        raise ConfigError(f"decision_threshold must be a number or one number per output, got {value!r}") from None
    if not values or not all(math.isfinite(v) and 0.0 < v < 1.0 for v in values):
        raise ConfigError(f"decision_threshold must be in (0, 1), got {value!r}; 0.5 is typical")
    if single:
        return values[0]
    if num_outputs is not None and len(values) != num_outputs:
        raise ConfigError(
            f"decision_threshold has {len(values)} thresholds but num_outputs={num_outputs}; give one "
            f"per output or a single number"
        )
    return values


class EvaluationBinary(BaseEvaluation):
    """Accuracy, precision, recall, F1 and false-alarm rate of each output column treated as its own binary task.

    Labels are 0/1 of shape (N, C) (or (N,) for one output); predictions are per-output probabilities (or logits,
    which get a sigmoid). An output is predicted positive when its probability is **strictly greater** than its
    decision threshold (DL4J's rule). Undefined ratios (0/0) are reported as 0, as scikit-learn does with
    ``zero_division=0``. ``average_*`` methods are unweighted means over outputs (scikit-learn ``"macro"``).

    Args:
        num_outputs: number of output columns; ``None`` infers it from the first batch (or from a list of
            thresholds).
        decision_threshold: probability above which an output counts as positive, in (0, 1): one number for every
            output, or one per output (DL4J's threshold array), e.g. ``[0.5, 0.2]`` when label 1 is rare. 0.5 is
            the usual start; lower it to trade precision for recall.

    Raises:
        ConfigError: ``num_outputs < 1``, a threshold outside (0, 1), or a list whose length differs from
            ``num_outputs``.
    """

    type_name = "EvaluationBinary"

    def __init__(self, num_outputs: int | None = None, decision_threshold: float | Sequence[float] = 0.5) -> None:
        check_int("num_outputs", num_outputs, 1, allow_none=True, none_means="infer")
        self.decision_threshold = _check_thresholds(decision_threshold, num_outputs)
        if num_outputs is None and isinstance(self.decision_threshold, list):
            num_outputs = len(self.decision_threshold)
        self._initial_num_outputs = num_outputs
        self.reset()

    def reset(self) -> None:
        self._num_outputs = self._initial_num_outputs
        self._counts: dict[str, np.ndarray] | None = None
        if self._num_outputs is not None:
            self._counts = {name: np.zeros(self._num_outputs, dtype=np.int64) for name in _COUNTS}

    @property
    def num_outputs(self) -> int | None:
        """Number of output columns (``None`` until inferred from the first batch)."""
        return self._num_outputs

    def _ensure_outputs(self, num_outputs: int) -> dict[str, np.ndarray]:
        if self._counts is None:
            self._num_outputs = num_outputs
            self._counts = {name: np.zeros(num_outputs, dtype=np.int64) for name in _COUNTS}
        elif num_outputs != self._num_outputs:
            raise DataError(
                f"predictions have {num_outputs} columns but this EvaluationBinary has num_outputs="
                f"{self._num_outputs}; every batch must have the same outputs"
            )
        return self._counts

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        probs = output_probabilities(predictions)  # (N, C)
        n_rows, n_cols = probs.shape
        counts = self._ensure_outputs(n_cols)
        actual = binary_labels(labels, n_rows, n_cols)  # bool (N, C)
        keep = element_mask(mask, n_rows, n_cols)  # bool (N, C)
        predicted = probs > np.asarray(self.decision_threshold)  # (N, C) > scalar or (C,)
        counts["tp"] += np.sum(actual & predicted & keep, axis=0)
        counts["fp"] += np.sum(~actual & predicted & keep, axis=0)
        counts["tn"] += np.sum(~actual & ~predicted & keep, axis=0)
        counts["fn"] += np.sum(actual & ~predicted & keep, axis=0)

    def _merge(self, other: EvaluationBinary) -> None:
        if other.decision_threshold != self.decision_threshold:
            raise ConfigError(
                f"cannot merge EvaluationBinary(decision_threshold={other.decision_threshold}) into "
                f"EvaluationBinary(decision_threshold={self.decision_threshold})"
            )
        if other._counts is None:
            return
        counts = self._ensure_outputs(int(other._num_outputs or 0))
        for name in _COUNTS:
            counts[name] += other._counts[name]

    # ------------------------------------------------------------------------------------------------ metrics
    def _count(self, name: str, output: int | None) -> np.ndarray:
        if self._counts is None:
            raise DataError("this EvaluationBinary has seen no data; call eval(labels, predictions) first")
        values = self._counts[name]
        if output is None:
            return values.copy()
        if not 0 <= output < values.size:
            raise DataError(f"output {output} is out of range for num_outputs={values.size}; use 0..{values.size - 1}")
        return values[output]

    def true_positives(self, output: int | None = None) -> Any:
        """True positives of ``output``, or an int64 (C,) array of all outputs."""
        return self._count("tp", output)

    def false_positives(self, output: int | None = None) -> Any:
        """False positives of ``output``, or all outputs."""
        return self._count("fp", output)

    def true_negatives(self, output: int | None = None) -> Any:
        """True negatives of ``output``, or all outputs."""
        return self._count("tn", output)

    def false_negatives(self, output: int | None = None) -> Any:
        """False negatives of ``output``, or all outputs."""
        return self._count("fn", output)

    def total_count(self, output: int | None = None) -> Any:
        """Number of unmasked examples of ``output``, or all outputs."""
        return sum(self._count(name, output) for name in _COUNTS)

    def _ratio(self, numerator: Any, denominator: Any) -> float:
        return float(safe_divide(numerator, denominator))

    def accuracy(self, output: int) -> float:
        """(TP + TN) / unmasked examples of ``output``."""
        return self._ratio(self._count("tp", output) + self._count("tn", output), self.total_count(output))

    def precision(self, output: int) -> float:
        """TP / (TP + FP) of ``output``."""
        tp = self._count("tp", output)
        return self._ratio(tp, tp + self._count("fp", output))

    def recall(self, output: int) -> float:
        """TP / (TP + FN) of ``output``."""
        tp = self._count("tp", output)
        return self._ratio(tp, tp + self._count("fn", output))

    def f1(self, output: int) -> float:
        """2TP / (2TP + FP + FN) of ``output``."""
        tp = self._count("tp", output)
        return self._ratio(2 * tp, 2 * tp + self._count("fp", output) + self._count("fn", output))

    def false_alarm_rate(self, output: int) -> float:
        """FP / (FP + TN) of ``output`` (the false-positive rate)."""
        fp = self._count("fp", output)
        return self._ratio(fp, fp + self._count("tn", output))

    def _average(self, per_output: Callable[[int], float]) -> float:
        return float(np.mean([per_output(i) for i in range(int(self._num_outputs or 0))]))

    def average_accuracy(self) -> float:
        """Mean of [`accuracy`][torchspark.evaluation.EvaluationBinary.accuracy] over outputs."""
        return self._average(self.accuracy)

    def average_precision(self) -> float:
        """Mean of [`precision`][torchspark.evaluation.EvaluationBinary.precision] over outputs (scikit-learn multilabel ``average="macro"``)."""
        return self._average(self.precision)

    def average_recall(self) -> float:
        """Mean of [`recall`][torchspark.evaluation.EvaluationBinary.recall] over outputs."""
        return self._average(self.recall)

    def average_f1(self) -> float:
        """Mean of [`f1`][torchspark.evaluation.EvaluationBinary.f1] over outputs."""
        return self._average(self.f1)

    def average_false_alarm_rate(self) -> float:
        """Mean of [`false_alarm_rate`][torchspark.evaluation.EvaluationBinary.false_alarm_rate] over outputs."""
        return self._average(self.false_alarm_rate)

    def stats(self) -> str:
        if self._counts is None:
            return "EvaluationBinary: no data (call eval first)"
        header = f"{'Output':>8}{'Acc':>9}{'F1':>9}{'Prec':>9}{'Recall':>9}{'FAR':>9}{'Total':>9}{'TP':>8}{'FP':>8}"
        header += f"{'TN':>8}{'FN':>8}"
        lines = [f"EvaluationBinary (positive when probability > decision threshold {self.decision_threshold})", header]
        for i in range(int(self._num_outputs or 0)):
            lines.append(
                f"{i:>8}{self.accuracy(i):>9.4f}{self.f1(i):>9.4f}{self.precision(i):>9.4f}{self.recall(i):>9.4f}"
                f"{self.false_alarm_rate(i):>9.4f}{int(self.total_count(i)):>9}{int(self._counts['tp'][i]):>8}"
                f"{int(self._counts['fp'][i]):>8}{int(self._counts['tn'][i]):>8}{int(self._counts['fn'][i]):>8}"
            )
        lines.append(
            f"{'average':>8}{self.average_accuracy():>9.4f}{self.average_f1():>9.4f}{self.average_precision():>9.4f}"
            f"{self.average_recall():>9.4f}{self.average_false_alarm_rate():>9.4f}"
        )
        return "\n".join(lines)

    # ---------------------------------------------------------------------------------------------- serialise
    def _config(self) -> dict[str, Any]:
        return {"num_outputs": self._num_outputs, "decision_threshold": self.decision_threshold}

    def _state(self) -> dict[str, Any]:
        return {"counts": None if self._counts is None else {k: v.tolist() for k, v in self._counts.items()}}

    def _load_state(self, state: dict[str, Any]) -> None:
        if state["counts"] is not None:
            self._counts = {name: np.asarray(state["counts"][name], dtype=np.int64) for name in _COUNTS}
            self._num_outputs = self._counts["tp"].size
