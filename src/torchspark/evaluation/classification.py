"""Multi-class classification metrics from a confusion matrix (DL4J's ``Evaluation``).

Averaging semantics match scikit-learn with ``labels=range(num_classes)`` and ``zero_division=0``:

* ``"macro"`` - unweighted mean of the per-class scores over **all** ``num_classes`` classes, including classes
  that never occur in labels or predictions (their score is 0 when its denominator is 0);
* ``"micro"`` - the score of the pooled counts (equals accuracy for single-label classification);
* ``"weighted"`` - per-class scores weighted by support (number of true examples of the class).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from torchspark.errors import ConfigError, DataError
from torchspark.evaluation._inputs import class_indices, class_probabilities, example_mask, safe_divide
from torchspark.evaluation.base import BaseEvaluation

__all__ = ["Evaluation", "AVERAGES"]


def _macro(numerator: np.ndarray, denominator: np.ndarray, support: np.ndarray) -> float:
    return float(np.mean(safe_divide(numerator, denominator)))


def _micro(numerator: np.ndarray, denominator: np.ndarray, support: np.ndarray) -> float:
    return float(safe_divide(numerator.sum(), denominator.sum()))


def _weighted(numerator: np.ndarray, denominator: np.ndarray, support: np.ndarray) -> float:
    if support.sum() == 0:
        return 0.0
    return float(np.average(safe_divide(numerator, denominator), weights=support))


# average name -> f(per-class numerators, per-class denominators, per-class support) -> score
AVERAGES: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], float]] = {
    "macro": _macro,
    "micro": _micro,
    "weighted": _weighted,
}


class Evaluation(BaseEvaluation):
    """Accuracy, precision, recall, F1, top-N accuracy and the confusion matrix of a classifier.

    Predictions are reduced with argmax (after softmax for logits); labels are class indices (N,) or one-hot /
    dense (N, C) rows (argmax). A single prediction column is read as P(class 1) of a binary problem.

    Args:
        num_classes: number of classes; ``None`` infers it from the first batch's prediction width. Set it when
            early batches may lack columns, e.g. a reader that trims unused classes.
        top_n: also count an example correct for :meth:`top_n_accuracy` when its true class is among the ``top_n``
            highest scores (ties count in the example's favour). 1 makes it equal to accuracy; 5 is common for
            ImageNet-style problems.
        labels: optional class names used by :meth:`stats`; its length must equal ``num_classes``.

    Raises:
        ConfigError: ``num_classes < 2``, ``top_n < 1`` or ``labels`` of the wrong length.
    """

    type_name = "Evaluation"

    def __init__(self, num_classes: int | None = None, top_n: int = 1, labels: Sequence[str] | None = None) -> None:
        if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 2):
            raise ConfigError(f"num_classes must be an int >= 2 or None (infer), got {num_classes!r}")
        if not isinstance(top_n, int) or top_n < 1:
            raise ConfigError(f"top_n must be an int >= 1, got {top_n!r}")
        if labels is not None and num_classes is not None and len(labels) != num_classes:
            raise ConfigError(f"labels has {len(labels)} names but num_classes={num_classes}; give one name per class")
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
            self._num_classes = num_classes
            self._confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
        elif num_classes != self._num_classes:
            raise DataError(
                f"predictions have {num_classes} columns but this Evaluation has num_classes={self._num_classes}; "
                f"every batch must score the same classes"
            )
        return self._confusion

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        probs = class_probabilities(predictions)  # (N, C)
        confusion = self._ensure_classes(probs.shape[1])
        n_rows, n_classes = probs.shape
        actual = class_indices(labels, n_classes, n_rows)  # (N,)
        keep = example_mask(mask, n_rows)
        if keep is not None:
            actual, probs = actual[keep], probs[keep]
        predicted = np.argmax(probs, axis=1)
        confusion += np.bincount(actual * n_classes + predicted, minlength=n_classes * n_classes).reshape(
            n_classes, n_classes
        )
        true_score = probs[np.arange(actual.size), actual]
        rank = np.sum(probs > true_score[:, None], axis=1)  # classes scored strictly higher than the true one
        self._top_n_correct += int(np.sum(rank < self.top_n))

    def _merge(self, other: Evaluation) -> None:
        if other.top_n != self.top_n:
            raise ConfigError(f"cannot merge Evaluation(top_n={other.top_n}) into Evaluation(top_n={self.top_n})")
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

    @staticmethod
    def _average(numerator: np.ndarray, denominator: np.ndarray, support: np.ndarray, average: str) -> float:
        try:
            reduce = AVERAGES[average]
        except KeyError:
            raise ConfigError(f"average must be one of {sorted(AVERAGES)}, got {average!r}") from None
        return reduce(numerator, denominator, support)

    def accuracy(self) -> float:
        """Fraction of examples whose argmax prediction is the true class (NaN with no examples)."""
        total = self.num_examples()
        return float(np.trace(self._matrix()) / total) if total else float("nan")

    def top_n_accuracy(self) -> float:
        """Fraction of examples whose true class is among the ``top_n`` highest-scored classes."""
        total = self.num_examples()
        return self._top_n_correct / total if total else float("nan")

    def _score(self, numerator: np.ndarray, denominator: np.ndarray, label: int | None, average: str) -> float:
        if label is not None:
            index = self._label(label)
            return float(safe_divide(numerator[index], denominator[index]))
        support = self.true_positives() + self.false_negatives()
        return self._average(numerator, denominator, support, average)

    def precision(self, label: int | None = None, average: str = "macro") -> float:
        """TP / (TP + FP) of class ``label``, or averaged over classes (``"macro"``, ``"micro"``, ``"weighted"``)."""
        tp = self.true_positives()
        return self._score(tp, tp + self.false_positives(), label, average)

    def recall(self, label: int | None = None, average: str = "macro") -> float:
        """TP / (TP + FN) of class ``label``, or averaged over classes."""
        tp = self.true_positives()
        return self._score(tp, tp + self.false_negatives(), label, average)

    def f1(self, label: int | None = None, average: str = "macro") -> float:
        """2TP / (2TP + FP + FN) of class ``label``, or averaged (macro F1 is the mean of per-class F1)."""
        tp = self.true_positives()
        return self._score(2 * tp, 2 * tp + self.false_positives() + self.false_negatives(), label, average)

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
        lines.append(f"Precision, recall & F1: macro-averaged (equally weighted avg. of {n_classes} classes)")
        never_predicted = [self.class_name(i) for i in np.flatnonzero(self._confusion.sum(axis=0) == 0)]
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
        return {"num_classes": self._num_classes, "top_n": self.top_n, "labels": self.labels}

    def _state(self) -> dict[str, Any]:
        confusion = None if self._confusion is None else self._confusion.tolist()
        return {"confusion": confusion, "top_n_correct": self._top_n_correct}

    def _load_state(self, state: dict[str, Any]) -> None:
        if state["confusion"] is not None:
            self._confusion = np.asarray(state["confusion"], dtype=np.int64)
            self._num_classes = self._confusion.shape[0]
        self._top_n_correct = int(state["top_n_correct"])
