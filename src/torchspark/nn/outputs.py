"""Evaluating a network with several outputs: which evaluation looks at which output.

DL4J's ComputationGraph evaluates one output at a time (``evaluate(iter, outputIndex)``) or every output with its
own evaluation. Here an evaluation is paired with an output index (``targets[i]`` for ``evaluations[i]``), so one
pass over the data fills an evaluation per output, or several for one chosen output.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch

from torchspark.data import iterate_minibatches
from torchspark.errors import ConfigError, DataError
from torchspark.evaluation import Evaluation, EvaluationBinary, RegressionEvaluation
from torchspark.nn.forward import Batch, ForwardNetwork, check_labels, feature_names, forward, losses_for, unpack
from torchspark.validation import check_int

__all__ = [
    "EvaluatedNetwork",
    "default_targets",
    "check_output_index",
    "fill_evaluations",
    "default_evaluation",
    "evaluate",
]


class EvaluatedNetwork(ForwardNetwork, Protocol):
    """What evaluation reads of a network ([`Network`][torchspark.Network] provides it)."""

    def default_evaluation(self, output_index: int = 0) -> Any: ...


def default_evaluation(network: ForwardNetwork, output_index: int = 0) -> Any:
    """The evaluation that fits the loss of output ``output_index``: classification, binary or regression.

    Example: a network with ``loss="bce_with_logits"`` gets an ``EvaluationBinary()``.
    """
    losses = network.losses
    name = losses[output_index if output_index < len(losses) else 0].name
    if name in ("cross_entropy", "model"):  # loss=None (the model's own loss) reads the logits as classes
        return Evaluation()
    if name == "bce_with_logits":
        return EvaluationBinary()
    return RegressionEvaluation()


def check_output_index(network: ForwardNetwork, output_index: Any) -> None:
    """ConfigError unless ``output_index`` is None or an int naming one of the network's losses' outputs."""
    if output_index is None:
        return
    check_int("output_index", output_index, 0, allow_none=True, none_means="every output")
    if len(network.losses) > 1 and output_index >= len(network.losses):
        raise ConfigError(
            f"output_index={output_index} but the network has {len(network.losses)} outputs "
            f"(0..{len(network.losses) - 1})"
        )


def default_targets(
    network: EvaluatedNetwork, evaluations: Sequence[Any], output_index: int | None
) -> tuple[list[Any], list[int]]:
    """The evaluations to fill and the output each one looks at.

    * evaluations given: all of them on ``output_index`` (None means output 0, as DL4J's ``evaluate``);
    * none given, ``output_index`` None and one loss per output (several losses): one default evaluation per
      output (classification, binary or regression, from that output's loss);
    * none given otherwise: the default evaluation of the chosen output (0 when None).
    """
    check_output_index(network, output_index)
    if evaluations:
        return list(evaluations), [output_index or 0] * len(evaluations)
    if output_index is None and len(network.losses) > 1:
        count = len(network.losses)
        return [network.default_evaluation(k) for k in range(count)], list(range(count))
    k = output_index or 0
    return [network.default_evaluation(k)], [k]


def fill_evaluations(
    network: ForwardNetwork, batches: Iterable[Batch], evaluations: Sequence[Any], targets: Sequence[int]
) -> int:
    """Fill ``evaluations[i]`` with output ``targets[i]`` against labels ``targets[i]``; returns batches seen.

    Raises:
        DataError: a batch without labels, or an output index the data/network does not have.
    """
    network.module.eval()
    seen = 0
    with torch.no_grad():
        for batch in batches:
            feats, labels, fmask, lmasks = unpack(network, batch)
            if labels is None:
                raise DataError("evaluation needs labels, but the batch has labels=None")
            outputs = forward(network, feats, fmask, feature_names(batch))
            check_labels(network, outputs, labels)
            losses = losses_for(network, len(outputs))
            for ev, k in zip(evaluations, targets):
                if k >= len(outputs):
                    raise DataError(f"output_index={k} but the network gives {len(outputs)} output(s)")
                probs = losses[k].activation(outputs[k]).cpu()
                mask = None if lmasks is None or lmasks[k] is None else lmasks[k].cpu()
                ev.eval(labels[k].cpu(), probs, mask)
            seen += 1
    return seen


def evaluate(
    network: EvaluatedNetwork,
    data: Batch | Iterable[Batch],
    evaluations: Sequence[Any] = (),
    batch_size: int = 256,
    output_index: int | None = None,
) -> Any:
    """Fill evaluations with the network's outputs on ``data`` (what ``Network.evaluate`` does).

    Args:
        evaluations: evaluation objects, all filled from output ``output_index`` (output 0 when None).
            None given: the evaluation that fits the loss; a network with one loss per output and
            ``output_index=None`` gets one per output, returned as a list (``evals[k]`` for output ``k``).
        output_index: which output (and label array) of a several-output network to evaluate.
    Returns:
        the evaluation, a tuple when several are given, or the per-output list described above.
    Raises:
        ConfigError: an output index the network does not have. DataError: no data or no labels.

    Example: ``ev = evaluate(net, DataSet(x, y))``; ``ev.accuracy()``.
    """
    evs, targets = default_targets(network, evaluations, output_index)
    if fill_evaluations(network, iterate_minibatches(data, batch_size), evs, targets) == 0:
        raise DataError("evaluate got no data: the DataSet or iterable is empty")
    if not evaluations and len(set(targets)) > 1:
        return evs
    return evs[0] if len(evs) == 1 else tuple(evs)
