"""EvaluationCalibration against sklearn.calibration.calibration_curve and a direct ECE computation."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.calibration import calibration_curve

from torchspark.errors import ConfigError, DataError
from torchspark.evaluation import EvaluationCalibration

N_CLASSES = 3


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(21)
    labels = rng.integers(0, N_CLASSES, 500)
    logits = 2.0 * rng.normal(size=(500, N_CLASSES)) + 1.5 * np.eye(N_CLASSES)[labels]
    return labels, np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)


def _filled(labels: np.ndarray, probs: np.ndarray, num_bins: int) -> EvaluationCalibration:
    evaluation = EvaluationCalibration(num_bins=num_bins)
    for start in range(0, len(labels), 128):
        evaluation.eval(labels[start : start + 128], probs[start : start + 128])
    return evaluation


@pytest.mark.parametrize("num_bins", [5, 10, 15])
def test_reliability_diagram_matches_sklearn(data: tuple[np.ndarray, np.ndarray], num_bins: int) -> None:
    labels, probs = data
    evaluation = _filled(labels, probs, num_bins)
    onehot = np.eye(N_CLASSES)[labels]
    for cls in [*range(N_CLASSES), None]:
        y = onehot.ravel() if cls is None else onehot[:, cls]
        p = probs.ravel() if cls is None else probs[:, cls]
        prob_true, prob_pred = calibration_curve(y, p, n_bins=num_bins, strategy="uniform")
        mean_predicted, fraction_positive, counts = evaluation.reliability_diagram(cls)
        assert counts.sum() == len(p)
        filled = counts > 0
        np.testing.assert_allclose(mean_predicted[filled], prob_pred)
        np.testing.assert_allclose(fraction_positive[filled], prob_true)
        assert np.isnan(mean_predicted[~filled]).all()
        histogram = np.histogram(p, np.linspace(0, 1, num_bins + 1))[0]
        np.testing.assert_array_equal(evaluation.probability_histogram(cls), histogram)


def test_expected_calibration_error(data: tuple[np.ndarray, np.ndarray]) -> None:
    labels, probs = data
    evaluation = _filled(labels, probs, 10)
    confidence, predicted = probs.max(axis=1), probs.argmax(axis=1)
    bins = np.clip(np.ceil(confidence * 10).astype(int) - 1, 0, 9)
    expected = 0.0
    for b in range(10):
        in_bin = bins == b
        if in_bin.any():
            accuracy = np.mean(predicted[in_bin] == labels[in_bin])
            expected += in_bin.sum() / len(labels) * abs(accuracy - confidence[in_bin].mean())
    assert evaluation.expected_calibration_error() == pytest.approx(expected)
    prob_true, prob_pred = calibration_curve(labels == 1, probs[:, 1], n_bins=10)
    counts = evaluation.reliability_diagram(1)[2]
    class_ece = np.sum(counts[counts > 0] / len(labels) * np.abs(prob_true - prob_pred))
    assert evaluation.expected_calibration_error(1) == pytest.approx(class_ece)
    np.testing.assert_array_equal(evaluation.label_counts(), np.bincount(labels, minlength=N_CLASSES))
    np.testing.assert_array_equal(evaluation.prediction_counts(), np.bincount(predicted, minlength=N_CLASSES))
    np.testing.assert_array_equal(
        evaluation.label_probability_histogram(2), np.histogram(probs[labels == 2, 2], np.linspace(0, 1, 11))[0]
    )
    assert evaluation.residual_histogram().sum() == probs.size
    assert "Expected calibration error" in evaluation.stats()


def test_mask_logits_and_errors(data: tuple[np.ndarray, np.ndarray]) -> None:
    labels, probs = data
    mask = np.arange(len(labels)) % 4 != 0
    masked = EvaluationCalibration()
    masked.eval(labels, np.log(probs), mask=mask)  # log-probabilities are logits: softmax restores probs
    subset = _filled(labels[mask], probs[mask], 10)
    np.testing.assert_array_equal(masked.reliability_diagram()[2], subset.reliability_diagram()[2])
    assert masked.expected_calibration_error() == pytest.approx(subset.expected_calibration_error())
    with pytest.raises(ConfigError, match="num_bins"):
        EvaluationCalibration(num_bins=0)
    with pytest.raises(DataError, match="no data"):
        EvaluationCalibration().expected_calibration_error()
    with pytest.raises(DataError, match="label index 3"):
        EvaluationCalibration().eval(np.array([3]), probs[:1])
