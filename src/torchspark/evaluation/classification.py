"""Multi-class classification metrics from a confusion matrix (DL4J's ``Evaluation``).

Averaging semantics match scikit-learn with ``labels=range(num_classes)`` and ``zero_division=0``:

* ``"binary"`` - the score of the positive class, class 1, of a two-class problem. This is the **default when
  there are two classes** (DL4J's ``precision()`` and scikit-learn's ``average="binary"`` do the same);
* ``"macro"`` - the default for three or more classes: the unweighted mean of the per-class scores over **all**
  ``num_classes`` classes, including classes that never occur in labels or predictions (their score is 0 when
  its denominator is 0);
* ``"micro"`` - the score of the pooled counts (equals accuracy for single-label classification);
* ``"weighted"`` - per-class scores weighted by support (number of true examples of the class).

How a prediction is chosen (one rule per evaluation, fixed at construction):

* default: the class with the highest probability (argmax);
* ``binary_decision_threshold=t`` (two classes only): class 1 when ``P(class 1) > t``, else class 0;
* ``cost_array=c``: the class with the highest ``c[k] * P(k)`` (DL4J's cost array), which raises the priority
  of classes whose misses cost more.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from torchspark.errors import ConfigError, DataError
from torchspark.evaluation._inputs import class_indices, class_probabilities, example_mask, safe_divide
from torchspark.evaluation.base import BaseEvaluation
from torchspark.validation import check_float, check_int

__all__ = ["Evaluation", "AVERAGES"]

POSITIVE_CLASS = 1  # the class "binary" averaging reports, as in DL4J and scikit-learn


def _macro(numerator: np.ndarray, denominator: np.ndarray, support: np.ndarray) -> float:
    return float(np.mean(safe_divide(numerator, denominator)))


def _micro(numerator: np.ndarray, denominator: np.ndarray, support: np.ndarray) -> float:
    return float(safe_divide(numerator.sum(), denominator.sum()))


def _weighted(numerator: np.ndarray, denominator: np.ndarray, support: np.ndarray) -> float:
    if support.sum() == 0:
        return 0.0
    return float(np.average(safe_divide(numerator, denominator), weights=support))


def _binary(numerator: np.ndarray, denominator: np.ndarray, support: np.ndarray) -> float:
    return float(safe_divide(numerator[POSITIVE_CLASS], denominator[POSITIVE_CLASS]))


# average name -> f(per-class numerators, per-class denominators, per-class support) -> score
AVERAGES: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], float]] = {
    "binary": _binary,
    "macro": _macro,
    "micro": _micro,
    "weighted": _weighted,
}


def _check_threshold(threshold: float | None, num_classes: int | None) -> float | None:
    if threshold is None:
        return None
    check_float(
        "binary_decision_threshold",
        threshold,
        above=0,
        below=1,
        allow_none=True,
        fix="0.5 equals argmax, lower values predict class 1 more often",
    )
    if num_classes not in (None, 2):
        raise ConfigError(
            f"binary_decision_threshold needs a two-class problem, but num_classes={num_classes}; "
            f"use cost_array to shift predictions between more classes"
        )
    return float(threshold)


def _check_cost(cost_array: Sequence[float] | None, num_classes: int | None) -> list[float] | None:
    if cost_array is None:
        return None
    try:
        cost = [float(c) for c in cost_array]
    except (TypeError, ValueError):
        raise ConfigError(f"cost_array must be a sequence of numbers, one per class, got {cost_array!r}") from None
    if len(cost) < 2 or not all(math.isfinite(c) and c >= 0 for c in cost) or not any(cost):
        raise ConfigError(
            f"cost_array must hold one finite number >= 0 per class (at least 2, not all 0), got "
            f"{cost_array!r}; [1, 1, ...] equals plain argmax"
        )
    if num_classes is not None and len(cost) != num_classes:
        raise ConfigError(f"cost_array has {len(cost)} entries but num_classes={num_classes}; give one per class")
    return cost


class Evaluation(BaseEvaluation):
    """Accuracy, precision, recall, F1, F-beta, G-measure, top-N accuracy and the confusion matrix of a classifier.

    Predictions are probabilities (or logits, softmax applied); labels are class indices (N,) or one-hot / dense
    (N, C) rows (argmax). A single prediction column is read as P(class 1) of a binary problem. Which class an
    example is predicted as is described in the module docstring.

    With two classes, ``precision()``, ``recall()``, ``f1()``, ``f_beta()`` and ``g_measure()`` report class 1;
    pass ``average="macro"`` (or ``"micro"``, ``"weighted"``) for an average over both classes.

    Args:
        num_classes: number of classes; ``None`` infers it from the first batch's prediction width (or from
            ``cost_array``). Set it when early batches may lack columns, e.g. a reader that trims unused classes.
        top_n: also count an example correct for [`top_n_accuracy`][torchspark.Evaluation.top_n_accuracy] when its true class is among the ``top_n``
            highest scores (ties count in the example's favour). 1 makes it equal to accuracy; 5 is common for
            ImageNet-style problems. Ranks use the plain probabilities, whatever the decision rule.
        labels: optional class names used by [`stats`][torchspark.Evaluation.stats]; its length must equal ``num_classes``.
        binary_decision_threshold: two classes only: predict class 1 when its probability is strictly greater than
            this, instead of argmax. Lower it (e.g. 0.3) to catch more positives at the cost of precision; pick it
            from [`ROC.precision_recall_curve`][torchspark.evaluation.ROC.precision_recall_curve]. ``None`` (default) = argmax.
        cost_array: one non-negative weight per class; the prediction is ``argmax(cost * probability)``. Weight a
            class above 1 when missing it costs more than a false alarm. ``None`` (default) = plain argmax.

    Raises:
        ConfigError: ``num_classes < 2``, ``top_n < 1``, ``labels`` of the wrong length, a threshold outside
            (0, 1) or with more than two classes, a bad ``cost_array``, or both a threshold and a cost array.
    """

    type_name = "Evaluation"

    def __init__(
        self,
        num_classes: int | None = None,
        top_n: int = 1,
        labels: Sequence[str] | None = None,
        binary_decision_threshold: float | None = None,
        cost_array: Sequence[float] | None = None,
    ) -> None:
        check_int("num_classes", num_classes, 2, allow_none=True, none_means="infer")
        check_int("top_n", top_n, 1)
        if labels is not None and num_classes is not None and len(labels) != num_classes:
            raise ConfigError(f"labels has {len(labels)} names but num_classes={num_classes}; give one name per class")
        if binary_decision_threshold is not None and cost_array is not None:
            raise ConfigError(
                "set either binary_decision_threshold or cost_array, not both: both decide the "
                "predicted class; with two classes, moving the threshold does what a cost array does"
            )
        self.binary_decision_threshold = _check_threshold(binary_decision_threshold, num_classes)
        self.cost_array = _check_cost(cost_array, num_classes)
        if num_classes is None and self.cost_array is not None:
            num_classes = len(self.cost_array)
        self._initial_num_classes = num_classes
        self.top_n = top_n
        self.labels = None if labels is None else [str(name) for name in labels]
        self.reset()

    # ----------------------------------------------------------------------------------------------- accumulate
    def reset(self) -> None:
        self._num_classes = self._initial_num_classes
        self._confusion: np.ndarray | None = None
        if self._num_classes is not None:
            self._confusion = np.zeros((self._num_classes, self._num_classes), dtype=np.int64)
        self._top_n_correct = 0

    @property
    def num_classes(self) -> int | None:
        """Number of classes (``None`` until the first batch when it is inferred)."""
        return self._num_classes

    def _ensure_classes(self, num_classes: int) -> np.ndarray:
        if self._confusion is None:
            if self.labels is not None and len(self.labels) != num_classes:
                raise DataError(f"predictions have {num_classes} columns but {len(self.labels)} label names were given")
            if self.binary_decision_threshold is not None and num_classes != 2:
                raise DataError(
                    f"predictions have {num_classes} columns but binary_decision_threshold needs two "
                    f"classes (one P(class 1) column or two softmax columns)"
                )
            self._num_classes = num_classes
            self._confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
        elif num_classes != self._num_classes:
            raise DataError(
                f"predictions have {num_classes} columns but this Evaluation has num_classes={self._num_classes}; "
                f"every batch must score the same classes"
            )
        return self._confusion

    def _predict(self, probs: np.ndarray) -> np.ndarray:
        """int64 (N,) predicted classes of (N, C) probabilities, by the rule set at construction."""
        if self.binary_decision_threshold is not None:
            return (probs[:, 1] > self.binary_decision_threshold).astype(np.int64)
        if self.cost_array is not None:
            return np.argmax(probs * np.asarray(self.cost_array), axis=1)
        return np.argmax(probs, axis=1)

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        probs = class_probabilities(predictions)  # (N, C)
        confusion = self._ensure_classes(probs.shape[1])
        n_rows, n_classes = probs.shape
        actual = class_indices(labels, n_classes, n_rows)  # (N,)
        keep = example_mask(mask, n_rows)
        if keep is not None:
            actual, probs = actual[keep], probs[keep]
        predicted = self._predict(probs)
        confusion += np.bincount(actual * n_classes + predicted, minlength=n_classes * n_classes).reshape(
            n_classes, n_classes
        )
        true_score = probs[np.arange(actual.size), actual]
        rank = np.sum(probs > true_score[:, None], axis=1)  # classes scored strictly higher than the true one
        self._top_n_correct += int(np.sum(rank < self.top_n))

    def _merge(self, other: Evaluation) -> None:
        for name in ("top_n", "binary_decision_threshold", "cost_array"):
            if getattr(other, name) != getattr(self, name):
                raise ConfigError(
                    f"cannot merge Evaluation({name}={getattr(other, name)!r}) into "
                    f"Evaluation({name}={getattr(self, name)!r}); use the same settings on every shard"
                )
        if other._confusion is None:
            return
        self._ensure_classes(other._confusion.shape[0])
        assert self._confusion is not None
        self._confusion += other._confusion
        self._top_n_correct += other._top_n_correct
        if self.labels is None:
            self.labels = other.labels

    # ------------------------------------------------------------------------------------------------- counts
    def _matrix(self) -> np.ndarray:
        if self._confusion is None:
            raise DataError("this Evaluation has seen no data; call eval(labels, predictions) first")
        return self._confusion

    def confusion_matrix(self) -> np.ndarray:
        """int64 (C, C) copy: rows are actual classes, columns predicted classes."""
        return self._matrix().copy()

    def num_examples(self) -> int:
        """Number of (unmasked) examples evaluated."""
        return int(self._matrix().sum())

    def true_positives(self) -> np.ndarray:
        """int64 (C,) per-class true positives."""
        return np.diag(self._matrix()).copy()

    def false_positives(self) -> np.ndarray:
        """int64 (C,) per-class false positives (predicted as the class, actually another)."""
        matrix = self._matrix()
        return matrix.sum(axis=0) - np.diag(matrix)

    def false_negatives(self) -> np.ndarray:
        """int64 (C,) per-class false negatives (actually the class, predicted as another)."""
        matrix = self._matrix()
        return matrix.sum(axis=1) - np.diag(matrix)

    def true_negatives(self) -> np.ndarray:
        """int64 (C,) per-class true negatives (one-vs-all)."""
        return self.num_examples() - self.true_positives() - self.false_positives() - self.false_negatives()

    # ------------------------------------------------------------------------------------------------ metrics
    def _label(self, label: int) -> int:
        n_classes = self._matrix().shape[0]
        if not 0 <= label < n_classes:
            raise DataError(f"label {label} is out of range for num_classes={n_classes}; use 0..{n_classes - 1}")
        return label

    def _resolve_average(self, average: str | None) -> str:
        """``None`` -> ``"binary"`` for two classes, else ``"macro"``; refuses unknown names and a misused binary."""
        n_classes = self._matrix().shape[0]
        if average is None:
            return "binary" if n_classes == 2 else "macro"
        if average not in AVERAGES:
            raise ConfigError(
                f"average must be one of {sorted(AVERAGES)} or None (binary for two classes, else "
                f"macro), got {average!r}"
            )
        if average == "binary" and n_classes != 2:
            raise ConfigError(
                f"average='binary' reports class 1 of a two-class problem but there are {n_classes} "
                f"classes; use 'macro', 'micro', 'weighted' or a label"
            )
        return average

    def accuracy(self) -> float:
        """Fraction of examples whose predicted class is the true class (NaN with no examples)."""
        total = self.num_examples()
        return float(np.trace(self._matrix()) / total) if total else float("nan")

    def top_n_accuracy(self) -> float:
        """Fraction of examples whose true class is among the ``top_n`` highest-scored classes."""
        total = self.num_examples()
        return self._top_n_correct / total if total else float("nan")

    def _score(self, numerator: np.ndarray, denominator: np.ndarray, label: int | None, average: str | None) -> float:
        if label is not None:
            index = self._label(label)
            return float(safe_divide(numerator[index], denominator[index]))
        support = self.true_positives() + self.false_negatives()
        return AVERAGES[self._resolve_average(average)](numerator, denominator, support)

    def precision(self, label: int | None = None, average: str | None = None) -> float:
        """TP / (TP + FP) of class ``label``, or over classes: ``None`` = class 1 of a two-class problem, else
        ``"macro"``; or ``"binary"``, ``"macro"``, ``"micro"``, ``"weighted"`` (see the module docstring)."""
        tp = self.true_positives()
        return self._score(tp, tp + self.false_positives(), label, average)

    def recall(self, label: int | None = None, average: str | None = None) -> float:
        """TP / (TP + FN) of class ``label``, or over classes (``average`` as for [`precision`][torchspark.Evaluation.precision])."""
        tp = self.true_positives()
        return self._score(tp, tp + self.false_negatives(), label, average)

    def f1(self, label: int | None = None, average: str | None = None) -> float:
        """2TP / (2TP + FP + FN) of class ``label``, or over classes (macro F1 is the mean of per-class F1)."""
        return self.f_beta(1.0, label, average)

    def f_beta(self, beta: float, label: int | None = None, average: str | None = None) -> float:
        """F-beta: ``(1 + b^2) P R / (b^2 P + R)`` of class ``label``, or over classes (``average`` as for
        [`precision`][torchspark.Evaluation.precision]; equals ``sklearn.metrics.fbeta_score``).

        Args:
            beta: weight of recall against precision; 1 is F1, 2 favours recall (missed positives cost more), 0.5
                favours precision.

        Raises:
            ConfigError: ``beta`` is not a finite number > 0.
        """
        check_float("beta", beta, above=0, finite=True, fix="1 gives F1")
        b2 = float(beta) ** 2
        tp, fp, fn = self.true_positives(), self.false_positives(), self.false_negatives()
        # (1+b2) TP / ((1+b2) TP + b2 FN + FP): the same value as the P/R form, and it pools correctly for micro
        return self._score((1 + b2) * tp, (1 + b2) * tp + b2 * fn + fp, label, average)

    def g_measure(self, label: int | None = None, average: str | None = None) -> float:
        """G-measure ``sqrt(precision * recall)`` of class ``label``, or over classes: macro/weighted average the
        per-class values, micro takes the pooled precision and recall (DL4J's ``gMeasure``)."""
        if label is not None:
            return math.sqrt(self.precision(label) * self.recall(label))
        resolved = self._resolve_average(average)
        if resolved == "binary":
            return self.g_measure(POSITIVE_CLASS)
        if resolved == "micro":
            return math.sqrt(self.precision(average="micro") * self.recall(average="micro"))
        tp, fp, fn = self.true_positives(), self.false_positives(), self.false_negatives()
        per_class = np.sqrt(safe_divide(tp, tp + fp) * safe_divide(tp, tp + fn))
        # average the per-class values: f(numerator=g, denominator=1)
        return AVERAGES[resolved](per_class, np.ones_like(per_class), tp + fn)

    def matthews_correlation(self, label: int | None = None) -> float:
        """Matthews correlation: one-vs-all for ``label``, or the multi-class R_K statistic when ``None``.

        Equals ``sklearn.metrics.matthews_corrcoef`` (0 when undefined).
        """
        if label is not None:
            index = self._label(label)
            tp, fp = float(self.true_positives()[index]), float(self.false_positives()[index])
            fn, tn = float(self.false_negatives()[index]), float(self.true_negatives()[index])
            denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
            return float((tp * tn - fp * fn) / denominator) if denominator else 0.0
        matrix = self._matrix().astype(np.float64)
        actual, predicted, total = matrix.sum(axis=1), matrix.sum(axis=0), matrix.sum()
        cov_ap = np.trace(matrix) * total - actual @ predicted
        cov_pp = total**2 - predicted @ predicted
        cov_aa = total**2 - actual @ actual
        return float(cov_ap / np.sqrt(cov_aa * cov_pp)) if cov_aa * cov_pp else 0.0

    # -------------------------------------------------------------------------------------------------- report
    def class_name(self, index: int) -> str:
        """The name given in ``labels`` for class ``index``, else the index as a string."""
        return self.labels[index] if self.labels is not None else str(index)

    def _averaging_note(self, n_classes: int) -> str:
        if n_classes == 2:
            return (
                f"Precision, recall & F1: reported for positive class (class {POSITIVE_CLASS} = "
                f"{self.class_name(POSITIVE_CLASS)}) only; precision(average='macro') averages both classes"
            )
        return f"Precision, recall & F1: macro-averaged (equally weighted avg. of {n_classes} classes)"

    def stats(self) -> str:
        if self._confusion is None:
            return "Evaluation: no data (call eval first)"
        n_classes = self._confusion.shape[0]
        lines = [
            "========================Evaluation Metrics========================",
            f" # of classes:    {n_classes}",
            f" # of examples:   {self.num_examples()}",
            f" Accuracy:        {self.accuracy():.4f}",
            f" Precision:       {self.precision():.4f}",
            f" Recall:          {self.recall():.4f}",
            f" F1 Score:        {self.f1():.4f}",
        ]
        if self.top_n > 1:
            lines.append(f" Top {self.top_n} Accuracy:  {self.top_n_accuracy():.4f}")
        lines.append(self._averaging_note(n_classes))
        if self.binary_decision_threshold is not None:
            lines.append(f"Binary decision threshold: class 1 when P(class 1) > {self.binary_decision_threshold}")
        if self.cost_array is not None:
            lines.append(f"Cost array: predictions are argmax(cost * probability), cost = {self.cost_array}")
        never_predicted = [self.class_name(int(i)) for i in np.flatnonzero(self._confusion.sum(axis=0) == 0)]
        if never_predicted and self.num_examples():
            lines.append(f"Warning: classes never predicted (precision counted as 0): {', '.join(never_predicted)}")
        lines += ["", "=========================Confusion Matrix========================="]
        width = max(5, len(str(int(self._confusion.max(initial=0)))) + 1)
        lines.append("".join(f"{i:>{width}}" for i in range(n_classes)))
        lines.append("-" * (width * n_classes))
        for i, row in enumerate(self._confusion):
            lines.append("".join(f"{int(v):>{width}}" for v in row) + f" | {i} = {self.class_name(i)}")
        lines += [
            "",
            "Confusion matrix format: Actual (rowClass) predicted as (columnClass) N times",
            "==================================================================",
        ]
        return "\n".join(lines)

    # ---------------------------------------------------------------------------------------------- serialise
    def _config(self) -> dict[str, Any]:
        return {
            "num_classes": self._num_classes,
            "top_n": self.top_n,
            "labels": self.labels,
            "binary_decision_threshold": self.binary_decision_threshold,
            "cost_array": self.cost_array,
        }

    def _state(self) -> dict[str, Any]:
        confusion = None if self._confusion is None else self._confusion.tolist()
        return {"confusion": confusion, "top_n_correct": self._top_n_correct}

    def _load_state(self, state: dict[str, Any]) -> None:
        if state["confusion"] is not None:
            self._confusion = np.asarray(state["confusion"], dtype=np.int64)
            self._num_classes = self._confusion.shape[0]
        self._top_n_correct = int(state["top_n_correct"])
