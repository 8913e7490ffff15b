"""EvaluationBinary and RegressionEvaluation against scikit-learn / numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn import metrics

from torchspark.errors import ConfigError, DataError
from torchspark.evaluation import EvaluationBinary, RegressionEvaluation


def _multilabel(seed: int = 3, n: int = 300, outputs: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, outputs)) < 0.4).astype(np.float64)
    probs = np.clip(0.35 * labels + 0.65 * rng.random((n, outputs)), 0.0, 1.0)
    return labels, probs


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
def test_binary_matches_sklearn_per_column(threshold: float) -> None:
    labels, probs = _multilabel()
    evaluation = EvaluationBinary(decision_threshold=threshold)
    for start in range(0, len(labels), 50):
        evaluation.eval(labels[start : start + 50], probs[start : start + 50])
    predicted = (probs > threshold).astype(int)
    for i in range(labels.shape[1]):
        y, yhat = labels[:, i], predicted[:, i]
        assert evaluation.accuracy(i) == pytest.approx(metrics.accuracy_score(y, yhat))
        assert evaluation.precision(i) == pytest.approx(metrics.precision_score(y, yhat, zero_division=0))
        assert evaluation.recall(i) == pytest.approx(metrics.recall_score(y, yhat, zero_division=0))
        assert evaluation.f1(i) == pytest.approx(metrics.f1_score(y, yhat, zero_division=0))
        tn, fp, fn, tp = metrics.confusion_matrix(y, yhat, labels=[0, 1]).ravel()
        assert (evaluation.true_positives(i), evaluation.false_positives(i)) == (tp, fp)
        assert (evaluation.true_negatives(i), evaluation.false_negatives(i)) == (tn, fn)
        assert evaluation.false_alarm_rate(i) == pytest.approx(fp / (fp + tn))
    for name in ("precision", "recall", "f1"):
        expected = getattr(metrics, f"{name}_score")(labels, predicted, average="macro", zero_division=0)
        assert getattr(evaluation, f"average_{name}")() == pytest.approx(expected)
    assert "average" in evaluation.stats()


def test_binary_logits_and_per_output_mask() -> None:
    labels, probs = _multilabel()
    probs = np.clip(probs, 1e-6, 1 - 1e-6)
    from_probs = EvaluationBinary()
    from_probs.eval(labels, probs)
    from_logits = EvaluationBinary()
    from_logits.eval(torch.tensor(labels), torch.logit(torch.tensor(probs)))
    np.testing.assert_array_equal(from_logits.true_positives(), from_probs.true_positives())
    np.testing.assert_array_equal(from_logits.false_positives(), from_probs.false_positives())
    mask = np.random.default_rng(0).random(labels.shape) > 0.25
    masked = EvaluationBinary()
    masked.eval(labels, probs, mask=mask)
    for i in range(labels.shape[1]):
        keep = mask[:, i]
        expected = metrics.precision_score(labels[keep, i], probs[keep, i] > 0.5, zero_division=0)
        assert masked.precision(i) == pytest.approx(expected)
        assert masked.total_count(i) == keep.sum()


def test_binary_rejects_bad_input() -> None:
    with pytest.raises(ConfigError, match="decision_threshold"):
        EvaluationBinary(decision_threshold=1.0)
    with pytest.raises(DataError, match="0 or 1"):
        EvaluationBinary().eval(np.array([[0.0, 2.0]]), np.array([[0.1, 0.9]]))
    evaluation = EvaluationBinary()
    evaluation.eval(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(DataError, match="num_outputs=3"):
        evaluation.eval(np.zeros((2, 2)), np.zeros((2, 2)))


def _regression_data(seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.normal(loc=[0.0, 1000.0, -3.0], scale=[1.0, 2.0, 5.0], size=(500, 3))  # a large-mean column too
    yhat = y + rng.normal(scale=[0.5, 1.0, 4.0], size=y.shape)
    return y, yhat


def test_regression_matches_sklearn_and_numpy() -> None:
    y, yhat = _regression_data()
    evaluation = RegressionEvaluation()
    for start in range(0, len(y), 37):
        evaluation.eval(torch.tensor(y[start : start + 37]), yhat[start : start + 37])
    for c in range(y.shape[1]):
        assert evaluation.mean_squared_error(c) == pytest.approx(metrics.mean_squared_error(y[:, c], yhat[:, c]))
        assert evaluation.mean_absolute_error(c) == pytest.approx(metrics.mean_absolute_error(y[:, c], yhat[:, c]))
        assert evaluation.root_mean_squared_error(c) == pytest.approx(
            np.sqrt(metrics.mean_squared_error(y[:, c], yhat[:, c]))
        )
        assert evaluation.r_squared(c) == pytest.approx(metrics.r2_score(y[:, c], yhat[:, c]), rel=1e-9)
        assert evaluation.relative_squared_error(c) == pytest.approx(1.0 - metrics.r2_score(y[:, c], yhat[:, c]))
        assert evaluation.pearson_correlation(c) == pytest.approx(np.corrcoef(y[:, c], yhat[:, c])[0, 1], rel=1e-9)
    assert evaluation.average_mean_squared_error() == pytest.approx(metrics.mean_squared_error(y, yhat))
    assert evaluation.average_mean_absolute_error() == pytest.approx(metrics.mean_absolute_error(y, yhat))
    assert evaluation.average_r_squared() == pytest.approx(metrics.r2_score(y, yhat))
    assert evaluation.num_examples(0) == len(y)
    assert "average" in evaluation.stats()


def test_regression_mask_and_constant_target() -> None:
    y, yhat = _regression_data()
    mask = np.random.default_rng(2).random(y.shape) > 0.4
    evaluation = RegressionEvaluation()
    evaluation.eval(y, yhat, mask=mask)
    for c in range(y.shape[1]):
        keep = mask[:, c]
        assert evaluation.r_squared(c) == pytest.approx(metrics.r2_score(y[keep, c], yhat[keep, c]))
        assert evaluation.num_examples(c) == keep.sum()
    constant = RegressionEvaluation()
    constant.eval(np.ones(4), np.array([1.0, 1.0, 1.0, 2.0]))
    assert constant.r_squared(0) == metrics.r2_score(np.ones(4), [1.0, 1.0, 1.0, 2.0]) == 0.0
    with pytest.raises(DataError, match="shape"):
        RegressionEvaluation().eval(np.ones((3, 2)), np.ones((3, 1)))
