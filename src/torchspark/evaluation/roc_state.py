"""Score accumulators and curve math behind `torchspark.evaluation.roc`.

A `ScoreAccumulator` holds the (score, is_positive) pairs of one binary problem, in one of two modes:

* exact (``threshold_steps=0``): every score and label is kept; merging concatenates. Memory grows with the
  data (16 bytes per example) but AUC/AUPRC equal scikit-learn's exactly.
* binned (``threshold_steps=K > 0``): scores are counted in K+1 bins ``floor(score * K)``, which is the same as
  evaluating the scores rounded down to the grid ``0, 1/K, ..., 1``. Memory is constant and merges are exact
  counts; the price is resolution (K=100..1000 is usually enough for AUC to 2-3 decimals).

Both modes reduce to (threshold, positives, negatives) counts per distinct threshold, from which the ROC curve,
AUC (trapezoidal rule) and AUPRC are computed.

AUPRC is *average precision*, the step-wise sum ``sum_k (R_k - R_{k-1}) * P_k`` over decreasing thresholds
(scikit-learn's ``average_precision_score``), not the trapezoidal area under the precision-recall curve, which
is optimistic.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchspark.errors import ConfigError, DataError
from torchspark.validation import check_int

__all__ = ["ScoreAccumulator", "auc_from_counts", "auprc_from_counts", "roc_curve_from_counts"]


def _cumulative(positives: np.ndarray, negatives: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative TP and FP counts as the threshold decreases (inputs ordered by decreasing threshold)."""
    return np.cumsum(positives, dtype=np.float64), np.cumsum(negatives, dtype=np.float64)


def roc_curve_from_counts(
    thresholds: np.ndarray, positives: np.ndarray, negatives: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds), starting at (0, 0) with threshold +inf like ``sklearn.metrics.roc_curve``.

    Inputs are ordered by decreasing threshold. NaN rates when a class is absent.
    """
    tps, fps = _cumulative(positives, negatives)
    n_pos, n_neg = (tps[-1], fps[-1]) if tps.size else (0.0, 0.0)
    tpr = np.concatenate([[0.0], tps / n_pos]) if n_pos else np.full(tps.size + 1, np.nan)
    fpr = np.concatenate([[0.0], fps / n_neg]) if n_neg else np.full(fps.size + 1, np.nan)
    return fpr, tpr, np.concatenate([[np.inf], thresholds.astype(np.float64)])


def auc_from_counts(thresholds: np.ndarray, positives: np.ndarray, negatives: np.ndarray) -> float:
    """Area under the ROC curve by the trapezoidal rule (NaN without both classes)."""
    fpr, tpr, _ = roc_curve_from_counts(thresholds, positives, negatives)
    if np.isnan(fpr).any() or np.isnan(tpr).any():
        return float("nan")
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))


def auprc_from_counts(thresholds: np.ndarray, positives: np.ndarray, negatives: np.ndarray) -> float:
    """Average precision ``sum_k (R_k - R_{k-1}) * P_k`` (NaN without positives)."""
    tps, fps = _cumulative(positives, negatives)
    if not tps.size or tps[-1] == 0:
        return float("nan")
    predicted = tps + fps
    precision = np.divide(tps, predicted, out=np.ones_like(tps), where=predicted > 0)
    recall = tps / tps[-1]
    return float(np.sum(np.diff(np.concatenate([[0.0], recall])) * precision))


class ScoreAccumulator:
    """The scores of one binary problem, exact or binned (see the module docstring).

    Args:
        threshold_steps: 0 keeps every score (exact); K > 0 counts scores in K+1 bins on [0, 1].

    Raises:
        ConfigError: negative ``threshold_steps``.
    """

    def __init__(self, threshold_steps: int = 0) -> None:
        check_int("threshold_steps", threshold_steps, 0, meaning="(0 = exact)")
        self.threshold_steps = threshold_steps
        self._scores: list[np.ndarray] = []  # exact mode: float64 chunks
        self._labels: list[np.ndarray] = []  # exact mode: bool chunks
        self._pos_hist = np.zeros(threshold_steps + 1, dtype=np.int64)  # binned mode
        self._neg_hist = np.zeros(threshold_steps + 1, dtype=np.int64)

    def add(self, scores: np.ndarray, positive: np.ndarray) -> None:
        """Add float64 (n,) scores with bool (n,) labels."""
        if self.threshold_steps == 0:
            self._scores.append(scores.astype(np.float64, copy=True))
            self._labels.append(positive.astype(bool, copy=True))
            return
        if scores.size and (scores.min() < 0.0 or scores.max() > 1.0):
            raise DataError(
                f"binned ROC (threshold_steps={self.threshold_steps}) needs scores in [0, 1], got range "
                f"[{scores.min()}, {scores.max()}]; pass probabilities or use threshold_steps=0"
            )
        bins = np.clip(np.floor(scores * self.threshold_steps), 0, self.threshold_steps).astype(np.int64)
        self._pos_hist += np.bincount(bins[positive], minlength=self.threshold_steps + 1)
        self._neg_hist += np.bincount(bins[~positive], minlength=self.threshold_steps + 1)

    def merge(self, other: ScoreAccumulator) -> None:
        """Add ``other``'s scores (same ``threshold_steps`` required)."""
        if other.threshold_steps != self.threshold_steps:
            raise ConfigError(
                f"cannot merge a ROC with threshold_steps={other.threshold_steps} into one with threshold_steps="
                f"{self.threshold_steps}; use the same setting on every shard"
            )
        self._scores.extend(chunk.copy() for chunk in other._scores)
        self._labels.extend(chunk.copy() for chunk in other._labels)
        self._pos_hist += other._pos_hist
        self._neg_hist += other._neg_hist

    def _exact_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if len(self._scores) > 1:  # compact so repeated queries do not re-concatenate
            self._scores = [np.concatenate(self._scores)]
            self._labels = [np.concatenate(self._labels)]
        if not self._scores:
            return np.zeros(0), np.zeros(0, dtype=bool)
        return self._scores[0], self._labels[0]

    def counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(thresholds, positives, negatives) per distinct threshold, ordered by decreasing threshold."""
        if self.threshold_steps > 0:
            grid = np.arange(self.threshold_steps + 1, dtype=np.float64) / self.threshold_steps
            return grid[::-1], self._pos_hist[::-1].copy(), self._neg_hist[::-1].copy()
        scores, labels = self._exact_arrays()
        distinct, inverse = np.unique(scores, return_inverse=True)
        positives = np.bincount(inverse, weights=labels, minlength=distinct.size).astype(np.int64)
        negatives = np.bincount(inverse, minlength=distinct.size).astype(np.int64) - positives
        return distinct[::-1], positives[::-1], negatives[::-1]

    def num_positives(self) -> int:
        """Number of positive examples seen."""
        if self.threshold_steps > 0:
            return int(self._pos_hist.sum())
        return int(self._exact_arrays()[1].sum())

    def num_negatives(self) -> int:
        """Number of negative examples seen."""
        if self.threshold_steps > 0:
            return int(self._neg_hist.sum())
        return int((~self._exact_arrays()[1]).sum())

    def auc(self) -> float:
        """Area under the ROC curve."""
        return auc_from_counts(*self.counts())

    def auprc(self) -> float:
        """Average precision (area under the precision-recall curve, step-wise)."""
        return auprc_from_counts(*self.counts())

    def roc_curve(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(fpr, tpr, thresholds) arrays."""
        return roc_curve_from_counts(*self.counts())

    def state(self) -> dict[str, Any]:
        """JSON-compatible state."""
        if self.threshold_steps > 0:
            return {"positives": self._pos_hist.tolist(), "negatives": self._neg_hist.tolist()}
        scores, labels = self._exact_arrays()
        return {"scores": scores.tolist(), "labels": labels.astype(np.int8).tolist()}

    @classmethod
    def from_state(cls, threshold_steps: int, state: dict[str, Any]) -> ScoreAccumulator:
        """Rebuild from `state`."""
        accumulator = cls(threshold_steps)
        if threshold_steps > 0:
            accumulator._pos_hist = np.asarray(state["positives"], dtype=np.int64)
            accumulator._neg_hist = np.asarray(state["negatives"], dtype=np.int64)
        elif state["scores"]:
            accumulator._scores = [np.asarray(state["scores"], dtype=np.float64)]
            accumulator._labels = [np.asarray(state["labels"], dtype=bool)]
        return accumulator
