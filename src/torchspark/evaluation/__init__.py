"""Mergeable evaluation metrics (DL4J's ``org.nd4j.evaluation`` classes, PyTorch style).

Every class is filled batch by batch with ``eval(labels, predictions, mask=None)``, merges exactly with
``merge(other)`` (so per-partition evaluations from Spark executors combine on the driver), round-trips through
``to_json()`` / ``from_json()`` (or [`evaluation_from_json`][torchspark.evaluation.evaluation_from_json] for any type) and prints ``stats()``.

Inputs are torch tensors or numpy arrays. Labels are class indices (N,) or one-hot / dense (N, C) rows for the
multi-class evaluations, 0/1 (N, C) for the per-output ones. A ``mask`` of shape (N,) or (N, C) excludes
entries where it is 0.

**Logits or probabilities?** Decided per ``eval`` call: if every prediction is in [0, 1] (and, for multi-column
softmax-type evaluations - [`Evaluation`][torchspark.Evaluation], [`ROCMultiClass`][torchspark.evaluation.ROCMultiClass], [`EvaluationCalibration`][torchspark.evaluation.EvaluationCalibration],
2-column [`ROC`][torchspark.evaluation.ROC] - every row sums to 1 within 1e-3) the predictions are used as probabilities; otherwise a
softmax (multi-class) or an element-wise sigmoid ([`EvaluationBinary`][torchspark.evaluation.EvaluationBinary], [`ROCBinary`][torchspark.evaluation.ROCBinary], single-column
inputs) is applied. [`RegressionEvaluation`][torchspark.RegressionEvaluation] uses predictions as they are.

Classes:

* [`Evaluation`][torchspark.Evaluation] - accuracy, precision/recall/F1/F-beta/G-measure (per class, binary = class 1 of two,
  macro, micro, weighted), top-N accuracy, confusion matrix, Matthews correlation; a binary decision threshold or
  a cost array.
* [`EvaluationBinary`][torchspark.evaluation.EvaluationBinary] - per-output binary metrics for multi-label models (one threshold per output).
* [`RegressionEvaluation`][torchspark.RegressionEvaluation] - MSE, MAE, RMSE, RSE, R^2, Pearson per column.
* [`ROC`][torchspark.evaluation.ROC], [`ROCBinary`][torchspark.evaluation.ROCBinary], [`ROCMultiClass`][torchspark.evaluation.ROCMultiClass] - ROC curve, AUC, AUPRC (exact or binned), and a
  [`PrecisionRecallCurve`][torchspark.evaluation.PrecisionRecallCurve] per column (points, lookups by threshold/precision/recall, confusion counts).
* [`EvaluationCalibration`][torchspark.evaluation.EvaluationCalibration] - reliability diagrams, expected calibration error, histograms.
"""

from __future__ import annotations

from torchspark.evaluation.base import BaseEvaluation
from torchspark.evaluation.binary import EvaluationBinary
from torchspark.evaluation.calibration import EvaluationCalibration
from torchspark.evaluation.classification import Evaluation
from torchspark.evaluation.pr_curve import BinaryConfusion, CurvePoint, PrecisionRecallCurve
from torchspark.evaluation.registry import EVALUATION_TYPES, evaluation_from_json
from torchspark.evaluation.regression import RegressionEvaluation
from torchspark.evaluation.roc import ROC, ROCBinary, ROCMultiClass

__all__ = [
    "BaseEvaluation",
    "BinaryConfusion",
    "CurvePoint",
    "EVALUATION_TYPES",
    "Evaluation",
    "EvaluationBinary",
    "EvaluationCalibration",
    "PrecisionRecallCurve",
    "ROC",
    "ROCBinary",
    "ROCMultiClass",
    "RegressionEvaluation",
    "evaluation_from_json",
]
