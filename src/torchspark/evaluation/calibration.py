"""Calibration of a classifier's probabilities (DL4J's ``EvaluationCalibration``).

Probabilities are binned on ``num_bins`` equal-width bins of [0, 1] with scikit-learn's ``calibration_curve``
rule: bin b holds ``edges[b] < p <= edges[b+1]`` (the first bin also holds 0). Per class c and bin b the state
counts the predictions ``p[:, c]`` falling in the bin, their sum, and how many of them belong to examples whose
label is c; a second set of bins holds the top-label confidence ``max_c p[:, c]`` with the number of correct
argmax predictions, for the expected calibration error. All counts merge exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchspark.errors import ConfigError, DataError
from torchspark.evaluation._inputs import class_indices, class_probabilities, example_mask, safe_divide
from torchspark.evaluation.base import BaseEvaluation
from torchspark.validation import check_int

__all__ = ["EvaluationCalibration"]

# state array name -> (shape, dtype); shape "CB" = (classes, bins), "B" = (bins,), "C" = (classes,)
_ARRAYS: dict[str, tuple[str, type]] = {
    "count": ("CB", np.int64),  # predictions p[:, c] per bin
    "prob_sum": ("CB", np.float64),  # sum of those predictions
    "positives": ("CB", np.int64),  # of those, examples whose label is c
    "residual_hist": ("CB", np.int64),  # histogram of |onehot - p|
    "conf_count": ("B", np.int64),  # top-label confidences per bin
    "conf_sum": ("B", np.float64),
    "conf_correct": ("B", np.int64),  # of those, correct argmax predictions
    "label_counts": ("C", np.int64),
    "prediction_counts": ("C", np.int64),
}


def _bin_index(probabilities: np.ndarray, num_bins: int) -> np.ndarray:
    """Bin of each probability, as ``np.searchsorted(interior_edges, p)`` in ``sklearn.calibration_curve``."""
    interior = np.linspace(0.0, 1.0, num_bins + 1)[1:-1]
    return np.searchsorted(interior, probabilities).astype(np.int64)


class EvaluationCalibration(BaseEvaluation):
    """Reliability diagrams, expected calibration error, probability/residual histograms and class counts.

    Labels are class indices (N,) or one-hot (N, C); predictions probabilities or logits (N, C), or one column
    P(class 1) of a binary problem; a (N,) mask drops examples.

    Args:
        num_bins: equal-width probability bins. More bins show finer detail but need more data per bin;
            10 (the usual reliability-diagram choice) to 20 is a sane start.

    Raises:
        ConfigError: ``num_bins < 1``.
    """

    type_name = "EvaluationCalibration"

    def __init__(self, num_bins: int = 10) -> None:
        check_int("num_bins", num_bins, 1, fix="10 is typical")
        self.num_bins = num_bins
        self.reset()

    def reset(self) -> None:
        self._num_classes: int | None = None
        self._arrays: dict[str, np.ndarray] = {}

    def _ensure_classes(self, num_classes: int) -> dict[str, np.ndarray]:
        if self._num_classes is None:
            self._num_classes = num_classes
            shapes = {"CB": (num_classes, self.num_bins), "B": (self.num_bins,), "C": (num_classes,)}
            self._arrays = {name: np.zeros(shapes[kind], dtype=dtype) for name, (kind, dtype) in _ARRAYS.items()}
        elif num_classes != self._num_classes:
            raise DataError(
                f"predictions have {num_classes} columns but this EvaluationCalibration has {self._num_classes} "
                f"classes; every batch must score the same classes"
            )
        return self._arrays

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        probs = class_probabilities(predictions)  # (N, C)
        n_rows, n_classes = probs.shape
        arrays = self._ensure_classes(n_classes)
        actual = class_indices(labels, n_classes, n_rows)  # (N,)
        keep = example_mask(mask, n_rows)
        if keep is not None:
            probs, actual = probs[keep], actual[keep]
        onehot = np.zeros_like(probs)
        onehot[np.arange(actual.size), actual] = 1.0
        bins = _bin_index(probs, self.num_bins)  # (N, C)
        flat = (np.arange(n_classes)[None, :] * self.num_bins + bins).ravel()  # (N*C,) index into (C, B)
        size = n_classes * self.num_bins
        arrays["count"] += np.bincount(flat, minlength=size).reshape(n_classes, self.num_bins)
        arrays["prob_sum"] += np.bincount(flat, weights=probs.ravel(), minlength=size).reshape(n_classes, -1)
        arrays["positives"] += (
            np.bincount(flat, weights=onehot.ravel(), minlength=size).reshape(n_classes, -1).astype(np.int64)
        )
        residual_bins = _bin_index(np.abs(onehot - probs), self.num_bins)
        residual_flat = (np.arange(n_classes)[None, :] * self.num_bins + residual_bins).ravel()
        arrays["residual_hist"] += np.bincount(residual_flat, minlength=size).reshape(n_classes, -1)
        predicted = np.argmax(probs, axis=1)
        confidence = probs[np.arange(actual.size), predicted]
        conf_bins = _bin_index(confidence, self.num_bins)
        arrays["conf_count"] += np.bincount(conf_bins, minlength=self.num_bins)
        arrays["conf_sum"] += np.bincount(conf_bins, weights=confidence, minlength=self.num_bins)
        arrays["conf_correct"] += np.bincount(conf_bins[predicted == actual], minlength=self.num_bins)
        arrays["label_counts"] += np.bincount(actual, minlength=n_classes)
        arrays["prediction_counts"] += np.bincount(predicted, minlength=n_classes)

    def _merge(self, other: EvaluationCalibration) -> None:
        if other.num_bins != self.num_bins:
            raise ConfigError(
                f"cannot merge EvaluationCalibration(num_bins={other.num_bins}) into "
                f"EvaluationCalibration(num_bins={self.num_bins})"
            )
        if other._num_classes is None:
            return
        arrays = self._ensure_classes(other._num_classes)
        for name, values in other._arrays.items():
            arrays[name] += values

    # ------------------------------------------------------------------------------------------------ metrics
    def _require(self) -> dict[str, np.ndarray]:
        if self._num_classes is None:
            raise DataError("this EvaluationCalibration has seen no data; call eval(labels, predictions) first")
        return self._arrays

    def _get(self, name: str, cls: int | None) -> np.ndarray:
        """(B,) row of a (C, B) array for class ``cls``, or summed over classes when ``cls`` is None."""
        values = self._require()[name]
        if cls is None:
            return values.sum(axis=0)
        num_classes = self._num_classes or 0  # _require() refused None
        if not 0 <= cls < num_classes:
            raise DataError(f"class {cls} is out of range for {num_classes} classes; use 0..{num_classes - 1}")
        return values[cls].copy()

    @property
    def num_classes(self) -> int | None:
        """Number of classes (``None`` before the first batch)."""
        return self._num_classes

    def bin_edges(self) -> np.ndarray:
        """float64 (num_bins + 1,) bin edges on [0, 1]."""
        return np.linspace(0.0, 1.0, self.num_bins + 1)

    def reliability_diagram(self, cls: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean_predicted, fraction_positive, counts), each (num_bins,), for class ``cls`` or all classes pooled.

        ``fraction_positive`` is the fraction of a bin's predictions ``p[:, c]`` whose example has label c; NaN in
        empty bins (``counts == 0``). Dropping empty bins gives ``sklearn.calibration.calibration_curve``'s
        (prob_pred, prob_true) on ``(labels == c, p[:, c])`` - or, pooled, on all (one-hot, probability) pairs.
        """
        counts = self._get("count", cls)
        mean_predicted = safe_divide(self._get("prob_sum", cls), counts, empty=np.nan)
        fraction_positive = safe_divide(self._get("positives", cls), counts, empty=np.nan)
        return mean_predicted, fraction_positive, counts

    def expected_calibration_error(self, cls: int | None = None) -> float:
        """Expected calibration error ``sum_b (n_b / N) |accuracy_b - confidence_b|``.

        With ``cls=None`` this is the usual top-label ECE (Guo et al., 2017): bins of the argmax confidence,
        accuracy = fraction of correct argmax predictions. With a class it is that class's one-vs-all ECE from
        its reliability diagram.
        """
        if cls is None:
            arrays = self._require()
            counts = arrays["conf_count"]
            confidence = safe_divide(arrays["conf_sum"], counts)
            accuracy = safe_divide(arrays["conf_correct"], counts)
        else:
            counts = self._get("count", cls)
            confidence = safe_divide(self._get("prob_sum", cls), counts)
            accuracy = safe_divide(self._get("positives", cls), counts)
        total = counts.sum()
        return float(np.sum(counts * np.abs(accuracy - confidence)) / total) if total else float("nan")

    def probability_histogram(self, cls: int | None = None) -> np.ndarray:
        """int64 (num_bins,) histogram of all predicted probabilities ``p[:, cls]`` (all classes when None)."""
        return self._get("count", cls)

    def label_probability_histogram(self, cls: int | None = None) -> np.ndarray:
        """int64 (num_bins,) histogram of ``p[:, cls]`` over the examples whose label is ``cls``."""
        return self._get("positives", cls)

    def residual_histogram(self, cls: int | None = None) -> np.ndarray:
        """int64 (num_bins,) histogram of ``|onehot_label - p|`` for class ``cls`` (all classes when None)."""
        return self._get("residual_hist", cls)

    def label_counts(self) -> np.ndarray:
        """int64 (C,) number of examples of each class."""
        return self._require()["label_counts"].copy()

    def prediction_counts(self) -> np.ndarray:
        """int64 (C,) number of examples predicted (argmax) as each class."""
        return self._require()["prediction_counts"].copy()

    def stats(self) -> str:
        if self._num_classes is None:
            return "EvaluationCalibration: no data (call eval first)"
        mean_predicted, fraction_positive, counts = self.reliability_diagram()
        lines = [
            f"EvaluationCalibration ({self.num_bins} bins, {self._num_classes} classes)",
            f" Expected calibration error (top label): {self.expected_calibration_error():.4f}",
            f" Label counts:      {self.label_counts().tolist()}",
            f" Prediction counts: {self.prediction_counts().tolist()}",
            " Reliability diagram (all classes pooled):",
            f"{'bin':>14}{'mean p':>10}{'frac pos':>10}{'count':>10}",
        ]
        edges = self.bin_edges()
        for b in range(self.num_bins):
            lines.append(
                f"  [{edges[b]:.2f}, {edges[b + 1]:.2f}]{mean_predicted[b]:>10.4f}{fraction_positive[b]:>10.4f}"
                f"{int(counts[b]):>10}"
            )
        return "\n".join(lines)

    # ---------------------------------------------------------------------------------------------- serialise
    def _config(self) -> dict[str, Any]:
        return {"num_bins": self.num_bins}

    def _state(self) -> dict[str, Any]:
        if self._num_classes is None:
            return {"num_classes": None}
        return {"num_classes": self._num_classes, **{name: v.tolist() for name, v in self._arrays.items()}}

    def _load_state(self, state: dict[str, Any]) -> None:
        if state["num_classes"] is None:
            return
        arrays = self._ensure_classes(int(state["num_classes"]))
        for name in arrays:
            arrays[name] = np.asarray(state[name], dtype=arrays[name].dtype)
