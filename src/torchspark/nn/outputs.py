"""Evaluating a network with several outputs: which evaluation looks at which output.

DL4J's ComputationGraph evaluates one output at a time (``evaluate(iter, outputIndex)``) or every output with its
own evaluation. Here an evaluation is paired with an output index (``targets[i]`` for ``evaluations[i]``), so one
pass over the data fills an evaluation per output, or several for one chosen output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch

from torchspark.errors import ConfigError, DataError

if TYPE_CHECKING:
    from torchspark.data import Batch
    from torchspark.nn.network import Network

__all__ = ["default_targets", "check_output_index", "fill_evaluations"]


def check_output_index(network: Network, output_index: Any) -> None:
    """ConfigError unless ``output_index`` is None or an int naming one of the network's losses' outputs."""
    if output_index is None:
        return
    if isinstance(output_index, bool) or not isinstance(output_index, int) or output_index < 0:
        raise ConfigError(f"output_index must be None (every output) or an int >= 0, got {output_index!r}")
    if len(network.losses) > 1 and output_index >= len(network.losses):
        raise ConfigError(f"output_index={output_index} but the network has {len(network.losses)} outputs "
                          f"(0..{len(network.losses) - 1})")


def default_targets(network: Network, evaluations: Sequence[Any],
                    output_index: int | None) -> tuple[list[Any], list[int]]:
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


def fill_evaluations(network: Network, batches: Iterable[Batch], evaluations: Sequence[Any],
                     targets: Sequence[int]) -> int:
    """Fill ``evaluations[i]`` with output ``targets[i]`` against labels ``targets[i]``; returns batches seen.

    Raises:
        DataError: a batch without labels, or an output index the data/network does not have.
    """
    network.module.eval()
    seen = 0
    with torch.no_grad():
        for batch in batches:
            feats, labels, fmask, lmasks = network._unpack(batch)
            if labels is None:
                raise DataError("evaluation needs labels, but the batch has labels=None")
            outputs = network._forward(feats, fmask)
            network._check_labels(outputs, labels)
            losses = network._losses_for(len(outputs))
            for ev, k in zip(evaluations, targets):
                if k >= len(outputs):
                    raise DataError(f"output_index={k} but the network gives {len(outputs)} output(s)")
                probs = losses[k].activation(outputs[k]).cpu()
                mask = None if lmasks is None or lmasks[k] is None else lmasks[k].cpu()
                ev.eval(labels[k].cpu(), probs, mask)
            seen += 1
    return seen
