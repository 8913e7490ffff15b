"""ROC, ROCBinary and ROCMultiClass against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn import metrics

from torchspark.errors import ConfigError, DataError
from torchspark.evaluation import ROC, ROCBinary, ROCMultiClass


def _binary(seed: int = 11, n: int = 600) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < 0.3).astype(np.int64)
    scores = 1.0 / (1.0 + np.exp(-(rng.normal(size=n) + 1.2 * labels)))
    scores[:40] = np.round(scores[:40], 1)  # some tied scores
    return labels, scores


def _quantize(scores: np.ndarray, steps: int) -> np.ndarray:
    return np.floor(scores * steps) / steps


def test_exact_roc_matches_sklearn() -> None:
    labels, scores = _binary()
    roc = ROC()
    for start in range(0, len(labels), 100):
        roc.eval(labels[start : start + 100], scores[start : start + 100])
    assert roc.auc() == pytest.approx(metrics.roc_auc_score(labels, scores))
    assert roc.auprc() == pytest.approx(metrics.average_precision_score(labels, scores))
    fpr, tpr, thresholds = roc.roc_curve()
    sk_fpr, sk_tpr, sk_thresholds = metrics.roc_curve(labels, scores, drop_intermediate=False)
    np.testing.assert_allclose(fpr, sk_fpr)
    np.testing.assert_allclose(tpr, sk_tpr)
    np.testing.assert_allclose(thresholds[1:], sk_thresholds[1:])
    assert roc.num_positives() == labels.sum() and roc.num_negatives() == (1 - labels).sum()


@pytest.mark.parametrize("steps", [10, 100])
def test_binned_roc_equals_sklearn_on_quantized_scores(steps: int) -> None:
    labels, scores = _binary()
    roc = ROC(threshold_steps=steps)
    roc.eval(labels, scores)
    quantized = _quantize(scores, steps)
    assert roc.auc() == pytest.approx(metrics.roc_auc_score(labels, quantized))
    assert roc.auprc() == pytest.approx(metrics.average_precision_score(labels, quantized))
    assert abs(roc.auc() - metrics.roc_auc_score(labels, scores)) < 2.0 / steps
    assert len(roc.roc_curve()[0]) == steps + 2


def test_roc_input_forms_agree() -> None:
    labels, scores = _binary()
    reference = metrics.roc_auc_score(labels, scores)
    two_column = np.stack([1 - scores, scores], axis=1)
    forms = [
        (labels[:, None], scores[:, None], None),
        (np.eye(2)[labels], two_column, None),
        (torch.tensor(labels), torch.logit(torch.tensor(scores)), None),  # single-column logits: sigmoid
        (labels, np.log(two_column) + 3.0, None),  # two-column logits: softmax
    ]
    for form_labels, form_predictions, mask in forms:
        roc = ROC()
        roc.eval(form_labels, form_predictions, mask)
        assert roc.auc() == pytest.approx(reference)
    mask = np.arange(len(labels)) % 3 != 0
    masked = ROC()
    masked.eval(labels, scores, mask=mask)
    assert masked.auc() == pytest.approx(metrics.roc_auc_score(labels[mask], scores[mask]))


def test_roc_rejects_bad_input() -> None:
    with pytest.raises(ConfigError, match="threshold_steps"):
        ROC(threshold_steps=-1)
    with pytest.raises(DataError, match="ROCMultiClass"):
        ROC().eval(np.zeros(2), np.full((2, 3), 1 / 3))
    with pytest.raises(DataError, match="0 or 1"):
        ROC().eval(np.array([0, 2]), np.array([0.1, 0.2]))
    one_class = ROC()
    one_class.eval(np.zeros(3), np.array([0.1, 0.5, 0.9]))
    assert np.isnan(one_class.auc()) and np.isnan(one_class.auprc())


@pytest.mark.parametrize("steps", [0, 50])
def test_roc_binary_per_column(steps: int) -> None:
    rng = np.random.default_rng(4)
    labels = (rng.random((300, 3)) < 0.5).astype(float)
    probs = np.clip(0.3 * labels + 0.7 * rng.random((300, 3)), 0, 1)
    mask = rng.random((300, 3)) > 0.2
    roc = ROCBinary(threshold_steps=steps)
    roc.eval(labels, probs, mask=mask)
    scores = probs if steps == 0 else _quantize(probs, steps)
    expected_auc = [metrics.roc_auc_score(labels[mask[:, i], i], scores[mask[:, i], i]) for i in range(3)]
    expected_ap = [metrics.average_precision_score(labels[mask[:, i], i], scores[mask[:, i], i]) for i in range(3)]
    np.testing.assert_allclose([roc.auc(i) for i in range(3)], expected_auc)
    np.testing.assert_allclose([roc.auprc(i) for i in range(3)], expected_ap)
    assert roc.average_auc() == pytest.approx(np.mean(expected_auc))


def test_roc_multiclass_one_vs_all() -> None:
    rng = np.random.default_rng(8)
    labels = rng.integers(0, 4, 400)
    logits = rng.normal(size=(400, 4)) + np.eye(4)[labels]
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    roc = ROCMultiClass()
    roc.eval(labels[:150], logits[:150])  # logits: softmax applied
    roc.eval(np.eye(4)[labels[150:]], probs[150:])  # one-hot labels, probabilities
    for c in range(4):
        assert roc.auc(c) == pytest.approx(metrics.roc_auc_score(labels == c, probs[:, c]))
        assert roc.auprc(c) == pytest.approx(metrics.average_precision_score(labels == c, probs[:, c]))
    assert roc.average_auc() == pytest.approx(metrics.roc_auc_score(labels, probs, multi_class="ovr"))
    assert roc.average_auprc() == pytest.approx(
        metrics.average_precision_score(np.eye(4)[labels], probs, average="macro")
    )
    with pytest.raises(DataError, match="label index 4"):
        roc.eval(np.array([4]), probs[:1])
