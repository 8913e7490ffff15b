"""Per-column regression metrics from mergeable sufficient statistics (DL4J's ``RegressionEvaluation``).

Per column the state is: count n, means of y and yhat, centred second moments M2(y), M2(yhat), the co-moment
C(y, yhat), the sum of squared errors and the sum of absolute errors. Two states combine exactly with Chan et al.'s
parallel update (the same algebra as merging raw sums of y, y^2, yhat, yhat^2, y*yhat, but without the
catastrophic cancellation of ``sum(y^2) - n*mean^2`` when the targets have a large mean)::

    delta = mean_b - mean_a
    M2    = M2_a + M2_b + delta^2 * n_a * n_b / n
    C     = C_a + C_b + delta_y * delta_yhat * n_a * n_b / n
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from torchspark.errors import DataError
from torchspark.evaluation._inputs import as_2d, as_float_array, element_mask, safe_divide
from torchspark.evaluation.base import BaseEvaluation
from torchspark.validation import check_int

__all__ = ["RegressionEvaluation"]

_FIELDS = ("mean_y", "mean_p", "m2_y", "m2_p", "c_yp", "sse", "sae")


def _batch_moments(y: np.ndarray, p: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Sufficient statistics of one (N, C) batch with a bool (N, C) keep-mask."""
    weight = keep.astype(np.float64)
    count = keep.sum(axis=0).astype(np.int64)  # (C,)
    mean_y = safe_divide((weight * y).sum(axis=0), count)
    mean_p = safe_divide((weight * p).sum(axis=0), count)
    dy = (y - mean_y) * weight  # (N, C), zero where masked
    dp = (p - mean_p) * weight
    err = (y - p) * weight
    stats = {
        "mean_y": mean_y,
        "mean_p": mean_p,
        "m2_y": (dy * dy).sum(axis=0),
        "m2_p": (dp * dp).sum(axis=0),
        "c_yp": (dy * dp).sum(axis=0),
        "sse": (err * err).sum(axis=0),
        "sae": np.abs(err).sum(axis=0),
    }
    return count, stats


def _combine(
    n_a: np.ndarray, a: dict[str, np.ndarray], n_b: np.ndarray, b: dict[str, np.ndarray]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Chan et al.'s pairwise combination of two per-column moment states."""
    n = n_a + n_b
    weight_ab = safe_divide(n_a.astype(np.float64) * n_b, n)  # n_a * n_b / n, 0 for empty columns
    delta_y = b["mean_y"] - a["mean_y"]
    delta_p = b["mean_p"] - a["mean_p"]
    share_b = safe_divide(n_b, n)
    return n, {
        "mean_y": a["mean_y"] + delta_y * share_b,
        "mean_p": a["mean_p"] + delta_p * share_b,
        "m2_y": a["m2_y"] + b["m2_y"] + delta_y * delta_y * weight_ab,
        "m2_p": a["m2_p"] + b["m2_p"] + delta_p * delta_p * weight_ab,
        "c_yp": a["c_yp"] + b["c_yp"] + delta_y * delta_p * weight_ab,
        "sse": a["sse"] + b["sse"],
        "sae": a["sae"] + b["sae"],
    }


class RegressionEvaluation(BaseEvaluation):
    """MSE, MAE, RMSE, relative squared error, R^2 and Pearson correlation per output column.

    Labels and predictions are raw values (no sigmoid/softmax) of the same shape, (N,) or (N, C); a (N,) mask
    drops whole examples and a (N, C) mask drops single values. Results match scikit-learn's
    ``mean_squared_error``, ``mean_absolute_error``, ``r2_score`` (with its ``force_finite`` rule: a constant
    target column scores 1.0 when predicted perfectly, else 0.0) and ``np.corrcoef``. ``average_*`` methods are
    unweighted means over columns (scikit-learn's ``multioutput="uniform_average"``).

    Args:
        num_columns: number of target columns; ``None`` infers it from the first batch.

    Raises:
        ConfigError: ``num_columns < 1``.
    """

    type_name = "RegressionEvaluation"

    def __init__(self, num_columns: int | None = None) -> None:
        check_int("num_columns", num_columns, 1, allow_none=True, none_means="infer")
        self._initial_num_columns = num_columns
        self.reset()

    def reset(self) -> None:
        self._num_columns = self._initial_num_columns
        self._count: np.ndarray | None = None
        self._moments: dict[str, np.ndarray] = {}
        if self._num_columns is not None:
            self._init_state(self._num_columns)

    def _init_state(self, num_columns: int) -> None:
        self._num_columns = num_columns
        self._count = np.zeros(num_columns, dtype=np.int64)
        self._moments = {name: np.zeros(num_columns, dtype=np.float64) for name in _FIELDS}

    @property
    def num_columns(self) -> int | None:
        """Number of target columns (``None`` until inferred from the first batch)."""
        return self._num_columns

    def _add(self, count: np.ndarray, moments: dict[str, np.ndarray]) -> None:
        if self._count is None:
            self._init_state(count.size)
        elif count.size != self._num_columns:
            raise DataError(
                f"got {count.size} columns but this RegressionEvaluation has num_columns={self._num_columns}; "
                f"every batch must have the same columns"
            )
        assert self._count is not None
        self._count, self._moments = _combine(self._count, self._moments, count, moments)

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        p = as_2d(as_float_array(predictions, "predictions"), "predictions")  # (N, C)
        y = as_2d(as_float_array(labels, "labels"), "labels")
        if y.shape != p.shape:
            raise DataError(f"labels have shape {y.shape} but predictions {p.shape}; they must match")
        keep = element_mask(mask, *p.shape)
        self._add(*_batch_moments(y, p, keep))

    def _merge(self, other: RegressionEvaluation) -> None:
        if other._count is not None:
            self._add(other._count, other._moments)

    # ------------------------------------------------------------------------------------------------ metrics
    def _column(self, name: str, column: int) -> float:
        if self._count is None:
            raise DataError("this RegressionEvaluation has seen no data; call eval(labels, predictions) first")
        if not 0 <= column < self._count.size:
            raise DataError(f"column {column} is out of range for num_columns={self._count.size}")
        if name == "count":
            return float(self._count[column])
        return float(self._moments[name][column])

    def _per_count(self, name: str, column: int) -> float:
        count = self._column("count", column)
        return self._column(name, column) / count if count else float("nan")

    def num_examples(self, column: int = 0) -> int:
        """Number of unmasked values seen in ``column``."""
        return int(self._column("count", column))

    def mean_squared_error(self, column: int) -> float:
        """Mean of (y - yhat)^2 in ``column``."""
        return self._per_count("sse", column)

    def mean_absolute_error(self, column: int) -> float:
        """Mean of |y - yhat| in ``column``."""
        return self._per_count("sae", column)

    def root_mean_squared_error(self, column: int) -> float:
        """Square root of [`mean_squared_error`][torchspark.RegressionEvaluation.mean_squared_error]."""
        return float(np.sqrt(self.mean_squared_error(column)))

    def relative_squared_error(self, column: int) -> float:
        """sum (y - yhat)^2 / sum (y - mean y)^2 (NaN for a constant target column)."""
        m2_y = self._column("m2_y", column)
        return self._column("sse", column) / m2_y if m2_y else float("nan")

    def r_squared(self, column: int) -> float:
        """Coefficient of determination 1 - SSE/SST, as ``sklearn.metrics.r2_score``."""
        m2_y, sse = self._column("m2_y", column), self._column("sse", column)
        if m2_y == 0.0:
            return 1.0 if sse == 0.0 else 0.0
        return 1.0 - sse / m2_y

    def pearson_correlation(self, column: int) -> float:
        """Pearson correlation of y and yhat in ``column`` (NaN when either is constant)."""
        denominator = np.sqrt(self._column("m2_y", column) * self._column("m2_p", column))
        return float(self._column("c_yp", column) / denominator) if denominator else float("nan")

    def _average(self, per_column: Callable[[int], float]) -> float:
        return float(np.mean([per_column(c) for c in range(int(self._num_columns or 0))]))

    def average_mean_squared_error(self) -> float:
        """Mean over columns of [`mean_squared_error`][torchspark.RegressionEvaluation.mean_squared_error]."""
        return self._average(self.mean_squared_error)

    def average_mean_absolute_error(self) -> float:
        """Mean over columns of [`mean_absolute_error`][torchspark.RegressionEvaluation.mean_absolute_error]."""
        return self._average(self.mean_absolute_error)

    def average_root_mean_squared_error(self) -> float:
        """Mean over columns of [`root_mean_squared_error`][torchspark.RegressionEvaluation.root_mean_squared_error]."""
        return self._average(self.root_mean_squared_error)

    def average_relative_squared_error(self) -> float:
        """Mean over columns of [`relative_squared_error`][torchspark.RegressionEvaluation.relative_squared_error]."""
        return self._average(self.relative_squared_error)

    def average_r_squared(self) -> float:
        """Mean over columns of [`r_squared`][torchspark.RegressionEvaluation.r_squared] (``r2_score(multioutput="uniform_average")``)."""
        return self._average(self.r_squared)

    def average_pearson_correlation(self) -> float:
        """Mean over columns of [`pearson_correlation`][torchspark.RegressionEvaluation.pearson_correlation]."""
        return self._average(self.pearson_correlation)

    def stats(self) -> str:
        if self._count is None:
            return "RegressionEvaluation: no data (call eval first)"
        header = f"{'Column':>8}{'MSE':>14}{'MAE':>14}{'RMSE':>14}{'RSE':>14}{'R^2':>14}{'PC':>14}{'Count':>10}"
        lines = [header]
        for c in range(self._count.size):
            lines.append(
                f"{c:>8}{self.mean_squared_error(c):>14.5e}{self.mean_absolute_error(c):>14.5e}"
                f"{self.root_mean_squared_error(c):>14.5e}{self.relative_squared_error(c):>14.5e}"
                f"{self.r_squared(c):>14.5e}{self.pearson_correlation(c):>14.5e}{int(self._count[c]):>10}"
            )
        lines.append(
            f"{'average':>8}{self.average_mean_squared_error():>14.5e}{self.average_mean_absolute_error():>14.5e}"
            f"{self.average_root_mean_squared_error():>14.5e}{self.average_relative_squared_error():>14.5e}"
            f"{self.average_r_squared():>14.5e}{self.average_pearson_correlation():>14.5e}"
        )
        return "\n".join(lines)

    # ---------------------------------------------------------------------------------------------- serialise
    def _config(self) -> dict[str, Any]:
        return {"num_columns": self._num_columns}

    def _state(self) -> dict[str, Any]:
        if self._count is None:
            return {"count": None}
        return {"count": self._count.tolist(), **{name: self._moments[name].tolist() for name in _FIELDS}}

    def _load_state(self, state: dict[str, Any]) -> None:
        if state["count"] is not None:
            self._init_state(len(state["count"]))
            self._count = np.asarray(state["count"], dtype=np.int64)
            self._moments = {name: np.asarray(state[name], dtype=np.float64) for name in _FIELDS}
