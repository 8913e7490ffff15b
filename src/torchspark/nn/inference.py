"""Inference and scoring of a network: activated outputs, per-example losses and the mean loss over data.

[`Network`][torchspark.Network]'s ``output``, ``batch_losses``, ``score_examples`` and ``score`` are these
functions; they read the network through `ForwardNetwork`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from torchspark.data import iterate_minibatches
from torchspark.errors import DataError
from torchspark.nn.forward import (
    Batch,
    ForwardNetwork,
    as_list,
    check_labels,
    forward,
    losses_for,
    per_example_losses,
    unpack,
)

__all__ = ["output", "batch_losses", "score_examples", "score"]


def output(net: ForwardNetwork, features: Any, train: bool = False, batch_size: int | None = None) -> Any:
    """Network outputs with the loss's output activation (softmax / sigmoid / identity).

    Args:
        net: the network.
        features: a tensor (or numpy array) of examples, or a list of them for several inputs.
        train: run in training mode (dropout active, batch-norm batch statistics) when True.
        batch_size: evaluate in chunks of this many examples to bound memory (None: all at once).
    Returns:
        a tensor on the CPU, or a tuple of tensors for several outputs.

    Example: ``probs = output(net, x_test, batch_size=1024)`` (``net.output(x_test, batch_size=1024)``).
    """
    feats = [torch.as_tensor(f) for f in as_list(features)]
    n = feats[0].shape[0]
    step = batch_size if batch_size else n
    if step <= 0:
        raise DataError(f"batch_size must be >= 1, got {batch_size!r}")
    net.module.train(train)
    dtype = net.params_view().dtype
    chunks: list[list[torch.Tensor]] = []
    with torch.set_grad_enabled(train):
        for start in range(0, max(n, 1), max(step, 1)):
            part = [
                f[start : start + step].to(net.device, dtype=dtype if f.is_floating_point() else f.dtype) for f in feats
            ]
            outs = forward(net, part)
            acts = [lo.activation(o) for lo, o in zip(losses_for(net, len(outs)), outs)]
            chunks.append([a.detach().cpu() for a in acts])
    merged = [torch.cat([c[k] for c in chunks]) for k in range(len(chunks[0]))]
    return merged[0] if len(merged) == 1 else tuple(merged)


def batch_losses(net: ForwardNetwork, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per_example_loss, weight)`` of one batch in the current mode, without gradients being required:
    the loss summed over outputs per example, and each example's weight (0 where every label is masked).

    Raises:
        DataError: a batch without labels, or labels that do not fit the outputs.
    """
    feats, labels, fmask, lmasks = unpack(net, batch)
    if labels is None:
        raise DataError("scoring needs labels, but the batch has labels=None")
    outputs = forward(net, feats, fmask)
    check_labels(net, outputs, labels)
    return per_example_losses(net, outputs, labels, lmasks)


def score_examples(net: ForwardNetwork, data: Batch | Iterable[Batch], batch_size: int = 256) -> torch.Tensor:
    """Per-example loss (summed over outputs), in data order, as a 1-D CPU tensor (evaluation mode, no gradients).

    Raises:
        DataError: no data.
    """
    net.module.eval()
    parts: list[torch.Tensor] = []
    with torch.no_grad():
        for batch in iterate_minibatches(data, batch_size):
            parts.append(batch_losses(net, batch)[0].cpu())
    if not parts:
        raise DataError("score got no data: the DataSet or iterable is empty")
    return torch.cat(parts)


def score(net: ForwardNetwork, data: Batch | Iterable[Batch], batch_size: int = 256) -> float:
    """Mean loss over all examples (label-masked examples excluded), in evaluation mode.

    Raises:
        DataError: no data, or every example masked.

    Example: ``score(net, DataSet(x, y))`` (``net.score(DataSet(x, y))``).
    """
    total, count = 0.0, 0.0
    net.module.eval()
    with torch.no_grad():
        for batch in iterate_minibatches(data, batch_size):
            per, weight = batch_losses(net, batch)
            total += float(per.sum())
            count += float(weight.sum())
    if count == 0:
        raise DataError("score got no data: the DataSet or iterable is empty")
    return total / count
