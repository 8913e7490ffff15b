"""ROC curves, AUC and AUPRC: binary ([`ROC`][torchspark.evaluation.ROC]), per output ([`ROCBinary`][torchspark.evaluation.ROCBinary]), one-vs-all
([`ROCMultiClass`][torchspark.evaluation.ROCMultiClass]).

``threshold_steps`` chooses exact (0: keeps every score, equals scikit-learn's ``roc_auc_score`` and
``average_precision_score``; merging concatenates) or binned (K > 0: constant memory, scores rounded down to a
grid of K steps). AUPRC is average precision - the step-wise ``sum_k (R_k - R_{k-1}) * P_k`` that
``sklearn.metrics.average_precision_score`` uses. AUC/AUPRC are NaN for a column that lacks positives (or, for
AUC, negatives); averages skip NaN columns. See `torchspark.evaluation.roc_state` for details.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchspark.errors import ConfigError, DataError
from torchspark.evaluation._inputs import (
    as_2d,
    as_float_array,
    binary_labels,
    class_indices,
    class_probabilities,
    element_mask,
    example_mask,
    output_probabilities,
    softmax_if_logits,
)
from torchspark.evaluation.base import BaseEvaluation
from torchspark.evaluation.pr_curve import PrecisionRecallCurve
from torchspark.evaluation.roc_state import ScoreAccumulator
from torchspark.validation import check_int

__all__ = ["ROC", "ROCBinary", "ROCMultiClass"]


class _ROCColumns(BaseEvaluation):
    """Shared machinery: one `ScoreAccumulator` per column (output or class)."""

    _unit = "column"

    def __init__(self, threshold_steps: int = 0) -> None:
        check_int("threshold_steps", threshold_steps, 0, meaning="(0 = exact)")
        self.threshold_steps = threshold_steps
        self.reset()

    def reset(self) -> None:
        self._columns: list[ScoreAccumulator] | None = None

    def _ensure_columns(self, count: int) -> list[ScoreAccumulator]:
        if self._columns is None:
            self._columns = [ScoreAccumulator(self.threshold_steps) for _ in range(count)]
        elif count != len(self._columns):
            raise DataError(
                f"got {count} {self._unit}s but this {type(self).__name__} has {len(self._columns)}; every batch "
                f"must have the same {self._unit}s"
            )
        return self._columns

    def _merge(self, other: _ROCColumns) -> None:
        if other.threshold_steps != self.threshold_steps:
            raise ConfigError(
                f"cannot merge {type(other).__name__}(threshold_steps={other.threshold_steps}) into "
                f"{type(self).__name__}(threshold_steps={self.threshold_steps})"
            )
        if other._columns is None:
            return
        for mine, theirs in zip(self._ensure_columns(len(other._columns)), other._columns):
            mine.merge(theirs)

    def _column(self, index: int) -> ScoreAccumulator:
        if self._columns is None:
            raise DataError(f"this {type(self).__name__} has seen no data; call eval(labels, predictions) first")
        if not 0 <= index < len(self._columns):
            raise DataError(f"{self._unit} {index} is out of range; use 0..{len(self._columns) - 1}")
        return self._columns[index]

    def _num_columns(self) -> int:
        return 0 if self._columns is None else len(self._columns)

    def auc(self, index: int) -> float:
        """Area under the ROC curve of ``index`` (NaN if it lacks positives or negatives)."""
        return self._column(index).auc()

    def auprc(self, index: int) -> float:
        """Average precision of ``index`` (NaN if it has no positives)."""
        return self._column(index).auprc()

    def roc_curve(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(fpr, tpr, thresholds) of ``index``; thresholds decrease from +inf."""
        return self._column(index).roc_curve()

    def precision_recall_curve(self, index: int) -> PrecisionRecallCurve:
        """The precision-recall curve of ``index`` with lookups by threshold, precision and recall (DL4J's
        ``getPrecisionRecallCurve``); see [`PrecisionRecallCurve`][torchspark.evaluation.PrecisionRecallCurve]."""
        return PrecisionRecallCurve.from_counts(*self._column(index).counts())

    def num_positives(self, index: int) -> int:
        """Positive examples seen for ``index``."""
        return self._column(index).num_positives()

    def num_negatives(self, index: int) -> int:
        """Negative examples seen for ``index``."""
        return self._column(index).num_negatives()

    def average_auc(self) -> float:
        """Mean AUC over columns with a defined AUC (NaN if none)."""
        values = [self.auc(i) for i in range(self._num_columns())]
        defined = [v for v in values if not np.isnan(v)]
        return float(np.mean(defined)) if defined else float("nan")

    def average_auprc(self) -> float:
        """Mean AUPRC over columns with a defined AUPRC (NaN if none)."""
        values = [self.auprc(i) for i in range(self._num_columns())]
        defined = [v for v in values if not np.isnan(v)]
        return float(np.mean(defined)) if defined else float("nan")

    def stats(self) -> str:
        if self._columns is None:
            return f"{type(self).__name__}: no data (call eval first)"
        mode = "exact" if self.threshold_steps == 0 else f"{self.threshold_steps} threshold steps"
        lines = [f"{type(self).__name__} ({mode})", f"{self._unit.capitalize():>8}{'AUC':>10}{'AUPRC':>10}{'#pos':>10}"]
        lines[-1] += f"{'#neg':>10}"
        for i in range(len(self._columns)):
            lines.append(
                f"{i:>8}{self.auc(i):>10.4f}{self.auprc(i):>10.4f}{self.num_positives(i):>10}"
                f"{self.num_negatives(i):>10}"
            )
        if len(self._columns) > 1:
            lines.append(f"{'average':>8}{self.average_auc():>10.4f}{self.average_auprc():>10.4f}")
        return "\n".join(lines)

    def _config(self) -> dict[str, Any]:
        return {"threshold_steps": self.threshold_steps}

    def _state(self) -> dict[str, Any]:
        return {"columns": None if self._columns is None else [column.state() for column in self._columns]}

    def _load_state(self, state: dict[str, Any]) -> None:
        if state["columns"] is not None:
            self._columns = [ScoreAccumulator.from_state(self.threshold_steps, s) for s in state["columns"]]


class ROC(_ROCColumns):
    """ROC curve, AUC and AUPRC of a binary classifier.

    Predictions: one probability (or logit, sigmoid applied) column (N,) / (N, 1) for the positive class, or a
    2-column softmax (N, 2) whose column 1 is the positive class. Labels: 0/1 (N,) / (N, 1), or one-hot (N, 2).
    A mask of shape (N,) drops examples.

    Args:
        threshold_steps: 0 for exact results (memory grows with the data); K > 0 for K-step binned counts of
            constant size - 100 to 1000 is a good range when evaluating millions of examples on Spark.

    Raises:
        ConfigError: negative ``threshold_steps``.
    """

    type_name = "ROC"

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        values = as_2d(as_float_array(predictions, "predictions"), "predictions")  # (N, 1) or (N, 2)
        n_rows, n_cols = values.shape
        if n_cols not in (1, 2):
            raise DataError(f"ROC is binary but predictions have {n_cols} columns; use ROCMultiClass or ROCBinary")
        scores = output_probabilities(values)[:, 0] if n_cols == 1 else softmax_if_logits(values)[:, 1]
        label_array = as_2d(as_float_array(labels, "labels"), "labels")
        positive = binary_labels(label_array, n_rows, label_array.shape[1])
        if positive.shape[1] > 2:
            raise DataError(f"ROC labels must be (N,), (N, 1) or one-hot (N, 2), got {positive.shape[1]} columns")
        positive = positive[:, -1]  # the single column, or column 1 of one-hot labels
        keep = example_mask(mask, n_rows)
        if keep is not None:
            scores, positive = scores[keep], positive[keep]
        self._ensure_columns(1)[0].add(scores, positive)

    def auc(self, index: int = 0) -> float:
        """Area under the ROC curve (equals ``sklearn.metrics.roc_auc_score`` when exact)."""
        return super().auc(index)

    def auprc(self, index: int = 0) -> float:
        """Average precision (equals ``sklearn.metrics.average_precision_score`` when exact)."""
        return super().auprc(index)

    def roc_curve(self, index: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(fpr, tpr, thresholds), as ``sklearn.metrics.roc_curve(..., drop_intermediate=False)`` when exact."""
        return super().roc_curve(index)

    def precision_recall_curve(self, index: int = 0) -> PrecisionRecallCurve:
        """Precision-recall curve; its arrays equal ``sklearn.metrics.precision_recall_curve`` when exact."""
        return super().precision_recall_curve(index)

    def num_positives(self, index: int = 0) -> int:
        return super().num_positives(index)

    def num_negatives(self, index: int = 0) -> int:
        return super().num_negatives(index)


class ROCBinary(_ROCColumns):
    """One independent ROC per output column of a multi-label (sigmoid) model.

    Labels are 0/1 (N, C); predictions per-output probabilities or logits (N, C); a mask may be (N,) or per
    output (N, C). ``auc(i)``, ``auprc(i)``, ``average_auc()``, ``average_auprc()``.

    Args:
        threshold_steps: as for [`ROC`][torchspark.evaluation.ROC].
    """

    type_name = "ROCBinary"
    _unit = "output"

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        probs = output_probabilities(predictions)  # (N, C)
        n_rows, n_cols = probs.shape
        columns = self._ensure_columns(n_cols)
        positive = binary_labels(labels, n_rows, n_cols)
        keep = element_mask(mask, n_rows, n_cols)
        for i, column in enumerate(columns):
            column.add(probs[keep[:, i], i], positive[keep[:, i], i])


class ROCMultiClass(_ROCColumns):
    """One-vs-all ROC per class of a softmax classifier.

    Labels are class indices (N,) or one-hot (N, C); predictions probabilities or logits (N, C); a mask of
    shape (N,) drops examples. Class c's ROC scores ``p[:, c]`` against ``label == c``, so ``average_auc()``
    equals ``roc_auc_score(y, p, multi_class="ovr", average="macro")`` when every class occurs.

    Args:
        threshold_steps: as for [`ROC`][torchspark.evaluation.ROC].
    """

    type_name = "ROCMultiClass"
    _unit = "class"

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        probs = class_probabilities(predictions)  # (N, C)
        n_rows, n_classes = probs.shape
        columns = self._ensure_columns(n_classes)
        actual = class_indices(labels, n_classes, n_rows)
        keep = example_mask(mask, n_rows)
        if keep is not None:
            probs, actual = probs[keep], actual[keep]
        for c, column in enumerate(columns):
            column.add(probs[:, c], actual == c)
