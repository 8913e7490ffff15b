"""Evaluation (multi-class) against scikit-learn on the same random predictions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn import metrics

from torchspark.errors import ConfigError, DataError
from torchspark.evaluation import Evaluation

N_CLASSES = 5


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    labels = rng.integers(0, N_CLASSES, size=400)
    logits = rng.normal(size=(400, N_CLASSES)) + 1.5 * np.eye(N_CLASSES)[labels]  # better than chance
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return labels, probs


def _evaluated(actual: np.ndarray, probs: np.ndarray, **kwargs: object) -> Evaluation:
    evaluation = Evaluation(**kwargs)
    for start in range(0, len(actual), 64):  # minibatches
        evaluation.eval(actual[start : start + 64], probs[start : start + 64])
    return evaluation


def test_metrics_match_sklearn(data: tuple[np.ndarray, np.ndarray]) -> None:
    labels, probs = data
    predicted = probs.argmax(axis=1)
    evaluation = _evaluated(labels, probs)
    classes = list(range(N_CLASSES))
    np.testing.assert_array_equal(evaluation.confusion_matrix(), metrics.confusion_matrix(labels, predicted))
    assert evaluation.confusion_matrix().dtype == np.int64
    assert evaluation.num_examples() == len(labels)
    assert evaluation.accuracy() == pytest.approx(metrics.accuracy_score(labels, predicted))
    sk_scores = {"precision": metrics.precision_score, "recall": metrics.recall_score, "f1": metrics.f1_score}
    for name, sk_fn in sk_scores.items():
        ours = getattr(evaluation, name)
        for average in ("macro", "micro", "weighted"):
            expected = sk_fn(labels, predicted, labels=classes, average=average, zero_division=0)
            assert ours(average=average) == pytest.approx(expected), (name, average)
        per_class = sk_fn(labels, predicted, labels=classes, average=None, zero_division=0)
        np.testing.assert_allclose([ours(label=c) for c in classes], per_class)
    assert evaluation.matthews_correlation() == pytest.approx(metrics.matthews_corrcoef(labels, predicted))
    for c in classes:
        assert evaluation.matthews_correlation(c) == pytest.approx(
            metrics.matthews_corrcoef(labels == c, predicted == c)
        )
    tp = evaluation.true_positives()
    np.testing.assert_array_equal(tp, [np.sum((labels == c) & (predicted == c)) for c in classes])
    fp = [np.sum((labels != c) & (predicted == c)) for c in classes]
    fn = [np.sum((labels == c) & (predicted != c)) for c in classes]
    np.testing.assert_array_equal(evaluation.false_positives(), fp)
    np.testing.assert_array_equal(evaluation.false_negatives(), fn)


@pytest.mark.parametrize("top_n", [1, 2, 3])
def test_top_n_accuracy_matches_sklearn(data: tuple[np.ndarray, np.ndarray], top_n: int) -> None:
    labels, probs = data
    evaluation = _evaluated(labels, probs, top_n=top_n)
    expected = metrics.top_k_accuracy_score(labels, probs, k=top_n, labels=list(range(N_CLASSES)))
    assert evaluation.top_n_accuracy() == pytest.approx(expected)
    if top_n == 1:
        assert evaluation.top_n_accuracy() == pytest.approx(evaluation.accuracy())


def test_macro_counts_classes_absent_from_data() -> None:
    labels = np.array([0, 0, 1, 1])
    probs = np.eye(4)[[0, 1, 1, 1]]  # classes 2 and 3 never occur: macro averages over all 4 with 0s
    evaluation = Evaluation(num_classes=4)
    evaluation.eval(labels, probs)
    expected = metrics.precision_score(labels, probs.argmax(1), labels=[0, 1, 2, 3], average="macro", zero_division=0)
    assert evaluation.precision() == pytest.approx(expected)
    assert evaluation.confusion_matrix().shape == (4, 4)


def test_logits_torch_and_one_hot_give_same_metrics(data: tuple[np.ndarray, np.ndarray]) -> None:
    labels, probs = data
    from_probs = _evaluated(labels, probs, top_n=2)
    from_logits = Evaluation(top_n=2)
    from_logits.eval(torch.nn.functional.one_hot(torch.tensor(labels), N_CLASSES), torch.log(torch.tensor(probs)) * 3.0)
    np.testing.assert_array_equal(from_logits.confusion_matrix(), from_probs.confusion_matrix())
    assert from_logits.top_n_accuracy() == from_probs.top_n_accuracy()


def test_single_probability_column_is_binary() -> None:
    labels = np.array([0, 1, 1, 0, 1])
    p_positive = np.array([0.2, 0.9, 0.4, 0.6, 0.7])
    evaluation = Evaluation()
    evaluation.eval(labels, p_positive)
    expected = metrics.confusion_matrix(labels, (p_positive > 0.5).astype(int))
    np.testing.assert_array_equal(evaluation.confusion_matrix(), expected)
    logits = Evaluation()
    logits.eval(labels, np.log(p_positive / (1 - p_positive)))
    np.testing.assert_array_equal(logits.confusion_matrix(), expected)


def test_mask_excludes_examples(data: tuple[np.ndarray, np.ndarray]) -> None:
    labels, probs = data
    mask = np.random.default_rng(1).random(len(labels)) > 0.3
    masked = Evaluation()
    masked.eval(labels, probs, mask=mask.astype(np.float32))
    subset = Evaluation()
    subset.eval(labels[mask], probs[mask])
    np.testing.assert_array_equal(masked.confusion_matrix(), subset.confusion_matrix())
    per_output_mask = np.repeat(mask[:, None], N_CLASSES, axis=1)
    masked_2d = Evaluation()
    masked_2d.eval(labels, probs, mask=per_output_mask)
    np.testing.assert_array_equal(masked_2d.confusion_matrix(), subset.confusion_matrix())
    mixed = per_output_mask.copy()
    mixed[0, 0] = not mixed[0, 1]
    with pytest.raises(DataError, match="mixes"):
        Evaluation().eval(labels, probs, mask=mixed)


@pytest.mark.parametrize("bad_label", [5, 9, -1])
def test_label_out_of_range_raises(data: tuple[np.ndarray, np.ndarray], bad_label: int) -> None:
    labels, probs = data
    labels = labels.copy()
    labels[3] = bad_label
    with pytest.raises(DataError, match=rf"label index {bad_label} .*num_classes=5"):
        Evaluation().eval(labels, probs)


def test_bad_inputs_and_config() -> None:
    with pytest.raises(ConfigError, match="top_n"):
        Evaluation(top_n=0)
    with pytest.raises(ConfigError, match="num_classes"):
        Evaluation(num_classes=1)
    evaluation = Evaluation(num_classes=3)
    with pytest.raises(DataError, match="4 columns"):
        evaluation.eval(np.array([0]), np.full((1, 4), 0.25))
    with pytest.raises(DataError, match="NaN"):
        evaluation.eval(np.array([0]), np.array([[np.nan, 0.5, 0.5]]))
    with pytest.raises(DataError, match="rows"):
        evaluation.eval(np.array([0, 1]), np.full((3, 3), 1 / 3))
    with pytest.raises(DataError, match="no data"):
        Evaluation().accuracy()
    with pytest.raises(ConfigError, match="average"):
        _evaluated(np.array([0, 1]), np.eye(2)).precision(average="samples")


def test_stats_report(data: tuple[np.ndarray, np.ndarray]) -> None:
    labels, probs = data
    evaluation = _evaluated(labels, probs, labels=["a", "b", "c", "d", "e"], top_n=2)
    report = evaluation.stats()
    assert f"{evaluation.accuracy():.4f}" in report
    assert f"{evaluation.f1():.4f}" in report
    assert "Confusion Matrix" in report and "| 4 = e" in report
    assert "Top 2 Accuracy" in report
