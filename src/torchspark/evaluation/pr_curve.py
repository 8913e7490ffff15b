"""Precision-recall curve of one binary problem, with lookups by threshold, precision and recall (DL4J's
``PrecisionRecallCurve``).

Get one from [`ROC.precision_recall_curve`][torchspark.evaluation.ROC.precision_recall_curve] (or the per-column ROC classes). An example is predicted
positive at threshold ``t`` when its score is ``>= t``. The curve has one point per distinct threshold in
**increasing** order - every distinct score (exact ROC) or every grid value ``k/K`` (binned ROC) - plus a final
point at ``t = +inf`` where nothing is predicted positive (precision 1, recall 0). So its thresholds, precision and
recall equal ``sklearn.metrics.precision_recall_curve`` on the same scores, with ``+inf`` appended to the
thresholds.

Typical use: pick the decision threshold that meets a target, e.g.::

    point = roc.precision_recall_curve().point_at_precision(0.9)   # lowest threshold with precision >= 0.9
    Evaluation(binary_decision_threshold=point.threshold)           # (strictly greater than: see Evaluation)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torchspark.errors import ConfigError
from torchspark.validation import check_float

__all__ = ["PrecisionRecallCurve", "CurvePoint", "BinaryConfusion"]


@dataclass(frozen=True)
class CurvePoint:
    """One point of a [`PrecisionRecallCurve`][torchspark.evaluation.PrecisionRecallCurve]: its index, threshold, precision and recall."""

    index: int
    threshold: float
    precision: float
    recall: float


@dataclass(frozen=True)
class BinaryConfusion:
    """Counts of a binary decision at one threshold."""

    threshold: float
    true_positives: int
    false_positives: int
    true_negatives: int
    false_negatives: int


def _check_fraction(name: str, value: float) -> float:
    return float(check_float(name, value, minimum=0, maximum=1))


@dataclass(frozen=True, eq=False)
class PrecisionRecallCurve:
    """Points of the precision-recall curve, in increasing threshold order (see the module docstring).

    Attributes:
        thresholds: float64 (P,), increasing, the last one ``+inf``.
        true_positives, false_positives: int64 (P,) counts of examples with score ``>= threshold``.
        num_positives, num_negatives: examples of each class.
    """

    thresholds: np.ndarray
    true_positives: np.ndarray
    false_positives: np.ndarray
    num_positives: int
    num_negatives: int

    @classmethod
    def from_counts(cls, thresholds: np.ndarray, positives: np.ndarray, negatives: np.ndarray) -> PrecisionRecallCurve:
        """Build from per-threshold counts ordered by **decreasing** threshold (``ScoreAccumulator.counts()``)."""
        tps = np.concatenate([[0], np.cumsum(positives, dtype=np.int64)])  # at +inf, then decreasing thresholds
        fps = np.concatenate([[0], np.cumsum(negatives, dtype=np.int64)])
        all_thresholds = np.concatenate([[np.inf], thresholds.astype(np.float64)])
        return cls(all_thresholds[::-1].copy(), tps[::-1].copy(), fps[::-1].copy(), int(tps[-1]), int(fps[-1]))

    # --------------------------------------------------------------------------------------------- the arrays
    @property
    def num_points(self) -> int:
        """Number of points (distinct thresholds + the final ``+inf`` point)."""
        return int(self.thresholds.size)

    @property
    def false_negatives(self) -> np.ndarray:
        """int64 (P,) positives with a score below each threshold."""
        return self.num_positives - self.true_positives

    @property
    def precision(self) -> np.ndarray:
        """float64 (P,) ``TP / (TP + FP)``; 1 where nothing is predicted positive (scikit-learn's convention)."""
        predicted = (self.true_positives + self.false_positives).astype(np.float64)
        return np.divide(self.true_positives, predicted, out=np.ones_like(predicted), where=predicted > 0)

    @property
    def recall(self) -> np.ndarray:
        """float64 (P,) ``TP / positives`` (NaN when there are no positives)."""
        if self.num_positives == 0:
            return np.full(self.num_points, np.nan)
        return self.true_positives / float(self.num_positives)

    def auprc(self) -> float:
        """Average precision ``sum_k (R_k - R_{k+1}) * P_k`` (equals [`ROC.auprc`][torchspark.evaluation.ROC.auprc]; NaN without positives)."""
        if self.num_positives == 0:
            return float("nan")
        recall, precision = self.recall, self.precision
        return float(np.sum((recall[:-1] - recall[1:]) * precision[:-1]))

    # -------------------------------------------------------------------------------------------- lookups
    def point(self, index: int) -> CurvePoint:
        """The point at ``index`` (0 = lowest threshold; negative indices count from the end)."""
        if not -self.num_points <= index < self.num_points:
            raise ConfigError(f"point index {index} is out of range for a curve of {self.num_points} points")
        index %= self.num_points
        return CurvePoint(index, float(self.thresholds[index]), float(self.precision[index]), float(self.recall[index]))

    def point_at_threshold(self, threshold: float) -> CurvePoint:
        """The point at ``threshold``, or, when no point has exactly that threshold, at the next higher one (as
        DL4J). Any finite threshold has one, since the last point is ``+inf``."""
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or np.isnan(threshold):
            raise ConfigError(f"threshold must be a number, got {threshold!r}")
        return self.point(int(np.searchsorted(self.thresholds, threshold, side="left")))

    def point_at_precision(self, precision: float) -> CurvePoint:
        """The point with the **lowest** threshold whose precision is ``>= precision`` (the most recall for that
        precision). Always found: the ``+inf`` point has precision 1."""
        target = _check_fraction("precision", precision)
        return self.point(int(np.flatnonzero(self.precision >= target)[0]))

    def point_at_recall(self, recall: float) -> CurvePoint:
        """The point with the **highest** threshold whose recall is ``>= recall`` (the most precision for that
        recall). Always found when there are positives: the lowest threshold has recall 1.

        Raises:
            ConfigError: ``recall`` outside [0, 1], or the data has no positives (recall is undefined).
        """
        target = _check_fraction("recall", recall)
        if self.num_positives == 0:
            raise ConfigError("this curve has no positive examples, so recall is undefined")
        return self.point(int(np.flatnonzero(self.recall >= target)[-1]))

    def confusion_at_point(self, index: int) -> BinaryConfusion:
        """TP, FP, TN, FN when predicting positive for scores ``>=`` the threshold of point ``index``."""
        point = self.point(index)
        tp, fp = int(self.true_positives[point.index]), int(self.false_positives[point.index])
        return BinaryConfusion(point.threshold, tp, fp, self.num_negatives - fp, self.num_positives - tp)

    def confusion_at_threshold(self, threshold: float) -> BinaryConfusion:
        """Counts at [`point_at_threshold`][torchspark.evaluation.PrecisionRecallCurve.point_at_threshold] ``(threshold)``: exact when ``threshold`` is one of the curve's
        thresholds, else at the next higher one (the same decisions as any threshold in between)."""
        return self.confusion_at_point(self.point_at_threshold(threshold).index)
