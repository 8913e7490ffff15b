"""Rebuild any evaluation from its JSON by the ``"type"`` field (a dict registry, no if/elif ladder)."""

from __future__ import annotations

from torchspark.errors import SerializationError
from torchspark.evaluation.base import BaseEvaluation, parse_evaluation_json
from torchspark.evaluation.binary import EvaluationBinary
from torchspark.evaluation.calibration import EvaluationCalibration
from torchspark.evaluation.classification import Evaluation
from torchspark.evaluation.regression import RegressionEvaluation
from torchspark.evaluation.roc import ROC, ROCBinary, ROCMultiClass

__all__ = ["EVALUATION_TYPES", "evaluation_from_json"]

# JSON "type" field -> evaluation class
EVALUATION_TYPES: dict[str, type[BaseEvaluation]] = {
    cls.type_name: cls
    for cls in (
        Evaluation,
        EvaluationBinary,
        RegressionEvaluation,
        ROC,
        ROCBinary,
        ROCMultiClass,
        EvaluationCalibration,
    )
}


def evaluation_from_json(text: str) -> BaseEvaluation:
    """Rebuild whichever evaluation [`BaseEvaluation.to_json`][torchspark.evaluation.BaseEvaluation.to_json] wrote.

    Raises:
        SerializationError: malformed JSON or an unknown ``"type"`` (the message lists the known ones).
    """
    type_name = parse_evaluation_json(text)["type"]
    try:
        cls = EVALUATION_TYPES[type_name]
    except (KeyError, TypeError):
        raise SerializationError(
            f"unknown evaluation type {type_name!r}; known types: {sorted(EVALUATION_TYPES)}"
        ) from None
    return cls.from_json(text)
