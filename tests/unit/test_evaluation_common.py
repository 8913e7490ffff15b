"""Contract shared by every evaluation: exact merges, JSON round-trips, reset, type checks, imports."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from torchspark.errors import ConfigError, DataError, SerializationError
from torchspark.evaluation import (
    EVALUATION_TYPES,
    ROC,
    BaseEvaluation,
    Evaluation,
    EvaluationBinary,
    EvaluationCalibration,
    RegressionEvaluation,
    ROCBinary,
    ROCMultiClass,
    evaluation_from_json,
)

RNG = np.random.default_rng(99)
N = 240


def _softmax_data() -> tuple[np.ndarray, np.ndarray]:
    labels = RNG.integers(0, 4, N)
    logits = RNG.normal(size=(N, 4)) + np.eye(4)[labels]
    return labels, np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)


def _multilabel_data() -> tuple[np.ndarray, np.ndarray]:
    labels = (RNG.random((N, 3)) < 0.5).astype(float)
    return labels, np.clip(0.3 * labels + 0.7 * RNG.random((N, 3)), 0, 1)


def _binary_data() -> tuple[np.ndarray, np.ndarray]:
    labels = (RNG.random(N) < 0.4).astype(float)
    return labels, np.clip(0.3 * labels + 0.7 * RNG.random(N), 0, 1)


def _regression_data() -> tuple[np.ndarray, np.ndarray]:
    y = RNG.normal(loc=50.0, size=(N, 2))
    return y, y + RNG.normal(size=(N, 2))


def _arrays(*values: Any) -> list[np.ndarray]:
    return [np.asarray(v, dtype=np.float64) for v in values]


def _roc_results(e: Any) -> list[np.ndarray]:
    count = 1 if isinstance(e, ROC) else len(e._columns)
    return _arrays(
        [e.auc(i) for i in range(count)], [e.auprc(i) for i in range(count)], *[e.roc_curve(i)[1] for i in range(count)]
    )


# name -> (factory, data, results(evaluation) -> arrays that must match)
CASES: dict[str, tuple[Callable[[], BaseEvaluation], Callable[[], tuple[np.ndarray, np.ndarray]], Callable]] = {
    "Evaluation": (
        lambda: Evaluation(top_n=2),
        _softmax_data,
        lambda e: _arrays(e.confusion_matrix(), e.accuracy(), e.top_n_accuracy(), e.f1(), e.precision(average="micro")),
    ),
    "EvaluationBinary": (
        lambda: EvaluationBinary(decision_threshold=0.4),
        _multilabel_data,
        lambda e: _arrays(e.true_positives(), e.false_positives(), e.true_negatives(), e.average_f1()),
    ),
    "RegressionEvaluation": (
        RegressionEvaluation,
        _regression_data,
        lambda e: _arrays(
            [e.mean_squared_error(c) for c in range(2)],
            [e.r_squared(c) for c in range(2)],
            [e.pearson_correlation(c) for c in range(2)],
            e.average_mean_absolute_error(),
        ),
    ),
    "ROC-exact": (ROC, _binary_data, _roc_results),
    "ROC-binned": (lambda: ROC(threshold_steps=20), _binary_data, _roc_results),
    "ROCBinary": (ROCBinary, _multilabel_data, _roc_results),
    "ROCBinary-binned": (lambda: ROCBinary(threshold_steps=30), _multilabel_data, _roc_results),
    "ROCMultiClass": (ROCMultiClass, _softmax_data, _roc_results),
    "EvaluationCalibration": (
        lambda: EvaluationCalibration(num_bins=8),
        _softmax_data,
        lambda e: _arrays(
            *e.reliability_diagram(), *e.reliability_diagram(2), e.expected_calibration_error(), e.label_counts()
        ),
    ),
}


def _assert_same(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(actual) == len(expected)
    for a, b in zip(actual, expected):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_merging_shards_equals_evaluating_at_once(case: str) -> None:
    factory, make_data, results = CASES[case]
    labels, predictions = make_data()
    whole = factory()
    whole.eval(labels, predictions)
    shards = [factory() for _ in range(3)]
    bounds = [0, 50, 51, 240]  # uneven shards, one of a single example
    for shard, start, stop in zip(shards, bounds[:-1], bounds[1:]):
        shard.eval(labels[start:stop], predictions[start:stop])
    merged = factory()  # an empty evaluation merges too (driver side starts empty)
    for shard in shards:
        assert merged.merge(shard) is merged
    _assert_same(results(merged), results(whole))
    assert merged.stats() == whole.stats()


@pytest.mark.parametrize("case", sorted(CASES))
def test_json_round_trip_preserves_results(case: str) -> None:
    factory, make_data, results = CASES[case]
    labels, predictions = make_data()
    original = factory()
    original.eval(labels, predictions)
    text = original.to_json()
    assert json.loads(text)["type"] == type(original).type_name
    for restored in (type(original).from_json(text), evaluation_from_json(text)):
        assert type(restored) is type(original)
        _assert_same(results(restored), results(original))
        restored.merge(original)  # restored objects stay fully usable
        empty_restored = evaluation_from_json(factory().to_json())
        empty_restored.eval(labels, predictions)
        _assert_same(results(empty_restored), results(original))


@pytest.mark.parametrize("case", sorted(CASES))
def test_reset_forgets_everything(case: str) -> None:
    factory, make_data, results = CASES[case]
    labels, predictions = make_data()
    evaluation = factory()
    evaluation.eval(labels[:30], predictions[:30])
    evaluation.reset()
    evaluation.eval(labels, predictions)
    fresh = factory()
    fresh.eval(labels, predictions)
    _assert_same(results(evaluation), results(fresh))


def test_merging_different_types_names_both() -> None:
    with pytest.raises(DataError, match="ROC.*Evaluation"):
        Evaluation().merge(ROC())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="threshold_steps"):
        ROC().merge(ROC(threshold_steps=10))
    with pytest.raises(ConfigError, match="top_n"):
        Evaluation(top_n=1).merge(Evaluation(top_n=3))
    three, four = Evaluation(), Evaluation()
    three.eval(np.array([0]), np.array([[0.8, 0.1, 0.1]]))
    four.eval(np.array([0]), np.array([[0.7, 0.1, 0.1, 0.1]]))
    with pytest.raises(DataError, match="num_classes=3"):
        three.merge(four)


def test_json_errors() -> None:
    with pytest.raises(SerializationError, match="decoded"):
        evaluation_from_json("not json")
    with pytest.raises(SerializationError, match="unknown evaluation type 'Nope'"):
        evaluation_from_json(json.dumps({"type": "Nope", "config": {}, "state": {}}))
    with pytest.raises(SerializationError, match="ROC"):
        Evaluation.from_json(ROC().to_json())


def test_registry_covers_every_class() -> None:
    assert set(EVALUATION_TYPES) == {
        "Evaluation",
        "EvaluationBinary",
        "RegressionEvaluation",
        "ROC",
        "ROCBinary",
        "ROCMultiClass",
        "EvaluationCalibration",
    }
    for name, cls in EVALUATION_TYPES.items():
        assert issubclass(cls, BaseEvaluation) and cls.type_name == name


@pytest.mark.parametrize(
    "module",
    ["base", "binary", "calibration", "classification", "registry", "regression", "roc", "roc_state", ""],
)
def test_public_modules_import_on_their_own(module: str) -> None:
    name = "torchspark.evaluation" + (f".{module}" if module else "")
    imported = importlib.import_module(name)
    for symbol in imported.__all__:
        assert hasattr(imported, symbol)
