"""DL4J-parity evaluation features against scikit-learn: binary default, F-beta, G-measure, decision threshold,
cost array, per-output thresholds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn import metrics

from torchspark.errors import ConfigError, DataError
from torchspark.evaluation import ROC, Evaluation, EvaluationBinary, ROCMultiClass, evaluation_from_json


def _binary_problem(n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(16)
    labels = (rng.random(n) < 0.35).astype(np.int64)
    p1 = np.clip(0.35 * labels + 0.65 * rng.random(n), 0.0, 1.0)  # P(class 1), better than chance
    return labels, np.stack([1 - p1, p1], axis=1)


def _multiclass_problem(n: int = 400, classes: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(17)
    labels = rng.integers(0, classes, n)
    logits = rng.normal(size=(n, classes)) + 1.2 * np.eye(classes)[labels]
    return labels, np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)


def test_two_classes_report_class_1_by_default_like_sklearn_binary() -> None:
    labels, probs = _binary_problem()
    predicted = probs.argmax(axis=1)
    evaluation = Evaluation()
    evaluation.eval(labels, probs)
    for name, sk_fn in {
        "precision": metrics.precision_score,
        "recall": metrics.recall_score,
        "f1": metrics.f1_score,
    }.items():
        ours = getattr(evaluation, name)
        binary = sk_fn(labels, predicted)  # scikit-learn's default average="binary", pos_label=1
        macro = sk_fn(labels, predicted, average="macro")
        assert ours() == pytest.approx(binary), name
        assert ours(average="binary") == pytest.approx(binary), name
        assert ours(average="macro") == pytest.approx(macro), name
        assert ours() != pytest.approx(macro), f"{name}: the test data must tell binary from macro"
    report = evaluation.stats()
    assert "reported for positive class (class 1 = 1) only" in report
    assert f"{evaluation.f1():.4f}" in report


def test_binary_average_needs_two_classes_and_more_classes_stay_macro() -> None:
    labels, probs = _multiclass_problem()
    evaluation = Evaluation()
    evaluation.eval(labels, probs)
    assert evaluation.precision() == pytest.approx(
        metrics.precision_score(labels, probs.argmax(1), average="macro", zero_division=0)
    )
    assert "macro-averaged" in evaluation.stats()
    with pytest.raises(ConfigError, match="average='binary'.*4 classes"):
        evaluation.f1(average="binary")


@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0, 3.0])
def test_f_beta_matches_sklearn(beta: float) -> None:
    labels, probs = _multiclass_problem()
    predicted = probs.argmax(1)
    evaluation = Evaluation()
    evaluation.eval(labels, probs)
    for average in ("macro", "micro", "weighted"):
        expected = metrics.fbeta_score(labels, predicted, beta=beta, average=average, zero_division=0)
        assert evaluation.f_beta(beta, average=average) == pytest.approx(expected), average
    per_class = metrics.fbeta_score(labels, predicted, beta=beta, average=None, zero_division=0)
    np.testing.assert_allclose([evaluation.f_beta(beta, c) for c in range(4)], per_class)
    b_labels, b_probs = _binary_problem()
    binary = Evaluation()
    binary.eval(b_labels, b_probs)
    assert binary.f_beta(beta) == pytest.approx(metrics.fbeta_score(b_labels, b_probs.argmax(1), beta=beta))
    if beta == 1.0:
        assert evaluation.f_beta(1.0, average="macro") == pytest.approx(evaluation.f1(average="macro"))
    with pytest.raises(ConfigError, match="beta"):
        evaluation.f_beta(0.0)


def test_g_measure_is_sqrt_of_sklearn_precision_times_recall() -> None:
    labels, probs = _multiclass_problem()
    predicted = probs.argmax(1)
    evaluation = Evaluation()
    evaluation.eval(labels, probs)
    precision = metrics.precision_score(labels, predicted, average=None, zero_division=0)
    recall = metrics.recall_score(labels, predicted, average=None, zero_division=0)
    per_class = np.sqrt(precision * recall)
    np.testing.assert_allclose([evaluation.g_measure(c) for c in range(4)], per_class)
    assert evaluation.g_measure(average="macro") == pytest.approx(per_class.mean())
    assert evaluation.g_measure() == pytest.approx(per_class.mean())
    support = np.bincount(labels, minlength=4)
    assert evaluation.g_measure(average="weighted") == pytest.approx(np.average(per_class, weights=support))
    micro = math.sqrt(
        metrics.precision_score(labels, predicted, average="micro")
        * metrics.recall_score(labels, predicted, average="micro")
    )
    assert evaluation.g_measure(average="micro") == pytest.approx(micro)
    b_labels, b_probs = _binary_problem()
    binary = Evaluation()
    binary.eval(b_labels, b_probs)
    b_pred = b_probs.argmax(1)
    assert binary.g_measure() == pytest.approx(
        math.sqrt(metrics.precision_score(b_labels, b_pred) * metrics.recall_score(b_labels, b_pred))
    )


@pytest.mark.parametrize("threshold", [0.2, 0.3, 0.7])
def test_binary_decision_threshold(threshold: float) -> None:
    labels, probs = _binary_problem()
    predicted = (probs[:, 1] > threshold).astype(int)
    assert not np.array_equal(predicted, probs.argmax(1)), "the threshold must change some predictions"
    for form in (probs, probs[:, 1]):  # two softmax columns or one P(class 1) column
        evaluation = Evaluation(binary_decision_threshold=threshold)
        evaluation.eval(labels, form)
        np.testing.assert_array_equal(evaluation.confusion_matrix(), metrics.confusion_matrix(labels, predicted))
        assert evaluation.precision() == pytest.approx(metrics.precision_score(labels, predicted))
        assert evaluation.recall() == pytest.approx(metrics.recall_score(labels, predicted))
    assert f"P(class 1) > {threshold}" in evaluation.stats()
    again = evaluation_from_json(evaluation.to_json())
    assert again.binary_decision_threshold == threshold
    again.eval(labels, probs)
    np.testing.assert_array_equal(again.confusion_matrix(), 2 * metrics.confusion_matrix(labels, predicted))


def test_cost_array_takes_argmax_of_cost_times_probability() -> None:
    labels, probs = _multiclass_problem()
    cost = [1.0, 3.0, 0.5, 1.0]
    predicted = np.argmax(probs * np.array(cost), axis=1)
    assert not np.array_equal(predicted, probs.argmax(1)), "the costs must change some predictions"
    evaluation = Evaluation(cost_array=cost, top_n=2)
    assert evaluation.num_classes == 4
    for start in range(0, len(labels), 100):
        evaluation.eval(labels[start : start + 100], probs[start : start + 100])
    np.testing.assert_array_equal(
        evaluation.confusion_matrix(), metrics.confusion_matrix(labels, predicted, labels=range(4))
    )
    assert evaluation.f1(average="macro") == pytest.approx(metrics.f1_score(labels, predicted, average="macro"))
    # top-N ranks the plain probabilities (DL4J applies the cost only to the predicted class)
    assert evaluation.top_n_accuracy() == pytest.approx(metrics.top_k_accuracy_score(labels, probs, k=2))
    assert "argmax(cost * probability)" in evaluation.stats()
    again = evaluation_from_json(evaluation.to_json())
    assert again.cost_array == cost
    np.testing.assert_array_equal(again.confusion_matrix(), evaluation.confusion_matrix())


def test_threshold_and_cost_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="binary_decision_threshold must be"):
        Evaluation(binary_decision_threshold=1.0)
    with pytest.raises(ConfigError, match="two-class"):
        Evaluation(num_classes=3, binary_decision_threshold=0.4)
    with pytest.raises(ConfigError, match="not both"):
        Evaluation(binary_decision_threshold=0.4, cost_array=[1.0, 2.0])
    with pytest.raises(ConfigError, match="cost_array must hold"):
        Evaluation(cost_array=[1.0, -1.0])
    with pytest.raises(ConfigError, match="num_classes=3"):
        Evaluation(num_classes=3, cost_array=[1.0, 2.0])
    with pytest.raises(DataError, match="binary_decision_threshold needs two"):
        Evaluation(binary_decision_threshold=0.4).eval(np.array([0, 2]), np.eye(3)[[0, 2]])
    with pytest.raises(DataError, match="3 columns"):
        Evaluation(cost_array=[1.0, 2.0]).eval(np.array([0, 2]), np.eye(3)[[0, 2]])
    one, other = Evaluation(binary_decision_threshold=0.3), Evaluation(binary_decision_threshold=0.4)
    with pytest.raises(ConfigError, match="binary_decision_threshold"):
        one.merge(other)


def test_evaluation_binary_one_threshold_per_output() -> None:
    rng = np.random.default_rng(19)
    labels = (rng.random((200, 3)) < 0.4).astype(float)
    probs = np.clip(0.3 * labels + 0.7 * rng.random((200, 3)), 0, 1)
    thresholds = [0.2, 0.5, 0.75]
    evaluation = EvaluationBinary(decision_threshold=thresholds)
    evaluation.eval(labels, probs)
    single = EvaluationBinary(decision_threshold=0.5)
    single.eval(labels, probs)
    for i, threshold in enumerate(thresholds):
        predicted = probs[:, i] > threshold
        assert evaluation.precision(i) == pytest.approx(metrics.precision_score(labels[:, i], predicted)), i
        assert evaluation.recall(i) == pytest.approx(metrics.recall_score(labels[:, i], predicted)), i
        assert evaluation.f1(i) == pytest.approx(metrics.f1_score(labels[:, i], predicted)), i
    assert evaluation.recall(0) > single.recall(0) and evaluation.recall(2) < single.recall(2)
    assert "0.75" in evaluation.stats()
    again = evaluation_from_json(evaluation.to_json())
    assert again.decision_threshold == thresholds
    np.testing.assert_array_equal(again.true_positives(), evaluation.true_positives())
    with pytest.raises(ConfigError, match="3 thresholds but num_outputs=2"):
        EvaluationBinary(num_outputs=2, decision_threshold=thresholds)
    with pytest.raises(ConfigError, match=r"in \(0, 1\)"):
        EvaluationBinary(decision_threshold=[0.5, 1.5])
    with pytest.raises(DataError, match="2 columns"):
        EvaluationBinary(decision_threshold=thresholds).eval(labels[:, :2], probs[:, :2])


def _scores(n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(18)
    labels = (rng.random(n) < 0.4).astype(int)
    scores = np.round(np.clip(0.3 * labels + 0.7 * rng.random(n), 0, 1), 2)  # rounding makes ties
    return labels, scores


@pytest.mark.parametrize("steps", [0, 10])
def test_precision_recall_curve_matches_sklearn(steps: int) -> None:
    labels, scores = _scores()
    roc = ROC(threshold_steps=steps)
    for start in range(0, len(labels), 70):
        roc.eval(labels[start : start + 70], scores[start : start + 70])
    # binned mode evaluates the scores rounded down to the grid k/steps
    seen = scores if steps == 0 else np.floor(scores * steps) / steps
    curve = roc.precision_recall_curve()
    precision, recall, thresholds = metrics.precision_recall_curve(labels, seen)
    if steps:  # the grid keeps empty bins: compare at sklearn's thresholds (distinct seen scores)
        keep = np.isin(curve.thresholds, np.append(thresholds, np.inf))
        assert keep.sum() == thresholds.size + 1
        assert curve.num_points == steps + 2
    else:
        keep = np.ones(curve.num_points, dtype=bool)
    np.testing.assert_allclose(curve.thresholds[keep], np.append(thresholds, np.inf))
    np.testing.assert_allclose(curve.precision[keep], precision)
    np.testing.assert_allclose(curve.recall[keep], recall)
    assert curve.auprc() == pytest.approx(metrics.average_precision_score(labels, seen))
    assert curve.auprc() == pytest.approx(roc.auprc())
    assert curve.num_positives == labels.sum() and curve.num_negatives == (1 - labels).sum()


def test_precision_recall_curve_lookups() -> None:
    labels, scores = _scores()
    roc = ROC()
    roc.eval(labels, scores)
    curve = roc.precision_recall_curve()
    # by threshold: exact hit, and a value between two scores rounds up to the next higher threshold
    exact = curve.point_at_threshold(0.5)
    assert exact.threshold == 0.5
    between = curve.point_at_threshold(0.505)
    assert between.threshold == min(t for t in scores if t >= 0.505)
    assert curve.point_at_threshold(2.0).threshold == np.inf
    for threshold in (0.3, 0.5, 0.505, 0.81):
        confusion = curve.confusion_at_threshold(threshold)
        predicted = scores >= confusion.threshold
        tn, fp, fn, tp = metrics.confusion_matrix(labels, predicted).ravel()
        assert (
            confusion.true_positives,
            confusion.false_positives,
            confusion.true_negatives,
            confusion.false_negatives,
        ) == (tp, fp, tn, fn)
        point = curve.point_at_threshold(threshold)
        assert point.precision == pytest.approx(metrics.precision_score(labels, predicted, zero_division=1))
        assert point.recall == pytest.approx(metrics.recall_score(labels, predicted))
    # by precision: the lowest threshold reaching it; by recall: the highest threshold reaching it (brute force)
    distinct = np.unique(scores)
    for target in (0.5, 0.7, 0.9):
        found = curve.point_at_precision(target)
        reaching = [t for t in distinct if metrics.precision_score(labels, scores >= t, zero_division=1) >= target]
        assert found.threshold == min(reaching) and found.precision >= target
    for target in (0.2, 0.5, 0.95, 1.0):
        found = curve.point_at_recall(target)
        reaching = [t for t in distinct if metrics.recall_score(labels, scores >= t) >= target]
        assert found.threshold == max(reaching) and found.recall >= target
    with pytest.raises(ConfigError, match="precision must be"):
        curve.point_at_precision(1.5)
    # per column on the multi-column ROCs
    multi = ROCMultiClass()
    probs = np.stack([1 - scores, scores], axis=1)
    multi.eval(labels, probs)
    np.testing.assert_allclose(multi.precision_recall_curve(1).precision, curve.precision)
