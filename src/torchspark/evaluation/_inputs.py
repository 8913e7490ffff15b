"""Turning ``eval(labels, predictions, mask)`` arguments into checked float64/int64 numpy arrays.

Logits vs probabilities (the one rule every evaluation class uses, decided per ``eval`` call):

* softmax-type classes ([`Evaluation`][torchspark.Evaluation], [`ROCMultiClass`][torchspark.evaluation.ROCMultiClass], [`EvaluationCalibration`][torchspark.evaluation.EvaluationCalibration], 2-column
  [`ROC`][torchspark.evaluation.ROC]): predictions of shape (N, C>1) are taken as probabilities when every value lies in [0, 1] **and**
  every row sums to 1 within ``ROW_SUM_TOLERANCE``; otherwise a softmax is applied to each row.
* per-output (sigmoid) classes ([`EvaluationBinary`][torchspark.evaluation.EvaluationBinary], [`ROCBinary`][torchspark.evaluation.ROCBinary], single-column [`ROC`][torchspark.evaluation.ROC]) and
  single-column predictions anywhere: taken as probabilities when every value lies in [0, 1]; otherwise a
  sigmoid is applied element-wise.

A batch of raw logits that happens to lie entirely inside [0, 1] is therefore read as probabilities; pass
probabilities (``torch.sigmoid``/``torch.softmax`` outputs) when that can happen.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from torchspark.errors import DataError

__all__: list[str] = []  # internal helpers; imported by the evaluation modules only

ROW_SUM_TOLERANCE = 1e-3  # float32 softmax rows sum to 1 within ~1e-6; 1e-3 also accepts rounded CSV output


def as_float_array(values: Any, name: str) -> np.ndarray:
    """A float64 numpy copy of a tensor / array / nested list; refuses NaN and Inf."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to(device="cpu", dtype=torch.float64).numpy()
    try:
        array = np.array(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"{name} must be a torch tensor or numpy array of numbers, got {type(values).__name__}"
        ) from exc
    if not np.all(np.isfinite(array)):
        bad = np.argwhere(~np.isfinite(array))[0].tolist()
        raise DataError(f"{name} contains NaN or Inf (first at index {bad}); clean the data or the model output first")
    return array


def as_2d(array: np.ndarray, name: str) -> np.ndarray:
    """(N,) -> (N, 1); (N, C) unchanged; anything else is refused."""
    if array.ndim == 1:
        return array[:, None]
    if array.ndim == 2:
        return array
    raise DataError(
        f"{name} must have shape (N,) or (N, C), got shape {array.shape}; for time series reshape "
        f"(N, C, T) to (N*T, C) with x.permute(0, 2, 1).reshape(-1, C) and flatten the mask to (N*T,)"
    )


def check_rows(n_rows: int, array: np.ndarray, name: str) -> None:
    if array.shape[0] != n_rows:
        raise DataError(f"{name} has {array.shape[0]} rows but predictions have {n_rows}; pass one row per example")


def sigmoid_if_logits(values: np.ndarray) -> np.ndarray:
    """Element-wise sigmoid unless every value is already in [0, 1]."""
    if values.size == 0 or (values.min() >= 0.0 and values.max() <= 1.0):
        return values
    return 1.0 / (1.0 + np.exp(-values))


def softmax_if_logits(values: np.ndarray) -> np.ndarray:
    """Row softmax of (N, C) unless it already holds probability rows (see the module docstring)."""
    if values.size == 0:
        return values
    in_range = values.min() >= 0.0 and values.max() <= 1.0
    if in_range and np.all(np.abs(values.sum(axis=1) - 1.0) <= ROW_SUM_TOLERANCE):
        return values
    shifted = np.exp(values - values.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def class_probabilities(predictions: Any) -> np.ndarray:
    """(N, C) class probabilities; a single column p (or (N,)) becomes the two columns [1 - p, p]."""
    values = as_2d(as_float_array(predictions, "predictions"), "predictions")
    if values.shape[1] == 1:
        positive = sigmoid_if_logits(values[:, 0])
        return np.stack([1.0 - positive, positive], axis=1)
    return softmax_if_logits(values)


def output_probabilities(predictions: Any) -> np.ndarray:
    """(N, C) independent per-output probabilities (sigmoid of logits)."""
    return sigmoid_if_logits(as_2d(as_float_array(predictions, "predictions"), "predictions"))


def class_indices(labels: Any, num_classes: int, n_rows: int) -> np.ndarray:
    """int64 (N,) class indices from indices (N,)/(N, 1) or one-hot/dense (N, num_classes) labels (argmax)."""
    array = as_2d(as_float_array(labels, "labels"), "labels")
    check_rows(n_rows, array, "labels")
    if array.shape[1] == 1:
        column = array[:, 0]
        if not np.all(column == np.round(column)):
            row = int(np.argmax(column != np.round(column)))
            raise DataError(
                f"labels must be integer class indices, got {column[row]} at row {row}; pass class indices "
                f"or one-hot rows of width num_classes={num_classes}"
            )
        indices = column.astype(np.int64)
        out_of_range = (indices < 0) | (indices >= num_classes)
        if np.any(out_of_range):
            row = int(np.argmax(out_of_range))
            raise DataError(
                f"label index {indices[row]} at row {row} is out of range for num_classes={num_classes}; "
                f"labels must be in [0, {num_classes}) - set num_classes to cover every class"
            )
        return indices
    if array.shape[1] != num_classes:
        raise DataError(
            f"one-hot labels have {array.shape[1]} columns but num_classes={num_classes}; "
            f"make the label width match the number of prediction columns"
        )
    return np.argmax(array, axis=1).astype(np.int64)


def binary_labels(labels: Any, n_rows: int, n_cols: int) -> np.ndarray:
    """bool (N, n_cols) from 0/1 labels of shape (N,) (when n_cols == 1) or (N, n_cols)."""
    array = as_2d(as_float_array(labels, "labels"), "labels")
    check_rows(n_rows, array, "labels")
    if array.shape[1] != n_cols:
        raise DataError(f"labels have {array.shape[1]} columns but predictions have {n_cols}; shapes must match")
    not_binary = (array != 0.0) & (array != 1.0)
    if np.any(not_binary):
        row, col = np.argwhere(not_binary)[0].tolist()
        raise DataError(
            f"binary labels must be 0 or 1, got {array[row, col]} at row {row}, column {col}; "
            f"threshold soft labels before evaluating"
        )
    return array == 1.0


def example_mask(mask: Any, n_rows: int) -> np.ndarray | None:
    """bool (N,) keep-mask from a (N,), (N, 1) or row-constant (N, C) mask (0 = ignore the example)."""
    if mask is None:
        return None
    array = as_2d(as_float_array(mask, "mask"), "mask")
    check_rows(n_rows, array, "mask")
    keep = array != 0.0
    if keep.shape[1] > 1 and not np.all(keep == keep[:, :1]):
        row = int(np.argmax(np.any(keep != keep[:, :1], axis=1)))
        raise DataError(
            f"this evaluation masks whole examples but mask row {row} mixes 0 and non-0 entries; pass a (N,) "
            f"mask, or use EvaluationBinary/ROCBinary for per-output masks"
        )
    return keep[:, 0]


def element_mask(mask: Any, n_rows: int, n_cols: int) -> np.ndarray:
    """bool (N, n_cols) keep-mask from None, a per-example (N,) mask or a per-output (N, n_cols) mask."""
    if mask is None:
        return np.ones((n_rows, n_cols), dtype=bool)
    array = as_2d(as_float_array(mask, "mask"), "mask")
    check_rows(n_rows, array, "mask")
    if array.shape[1] == 1:
        return np.repeat(array != 0.0, n_cols, axis=1)
    if array.shape[1] != n_cols:
        raise DataError(f"mask has {array.shape[1]} columns but predictions have {n_cols}; use (N,) or (N, {n_cols})")
    return array != 0.0


def safe_divide(numerator: np.ndarray | float, denominator: np.ndarray | float, empty: float = 0.0) -> np.ndarray:
    """numerator / denominator with ``empty`` where the denominator is 0 (scikit-learn's ``zero_division``)."""
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    out = np.full(np.broadcast(num, den).shape, empty, dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out
