"""Inference and scoring of a network: activated outputs, per-example losses and the mean loss over data.

[`Network`][torchspark.Network]'s ``output``, ``batch_losses``, ``score_examples`` and ``score`` are these
functions; they read the network through `ForwardNetwork`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from torchspark.data import iterate_minibatches
from torchspark.data.torchdata import is_torch_data
from torchspark.errors import ConfigError, DataError
from torchspark.nn.forward import (
    Batch,
    ForwardNetwork,
    as_list,
    check_labels,
    feature_names,
    forward,
    losses_for,
    model_loss,
    per_example_losses,
    unpack,
)
from torchspark.nn.losses import uses_model_loss
from torchspark.validation import check_choice

__all__ = [
    "NON_FINITE_ACTIONS",
    "check_non_finite",
    "non_finite_rows",
    "non_finite_message",
    "output",
    "PREDICT_OUTPUTS",
    "predict",
    "batch_losses",
    "score_examples",
    "score",
]

#: what inference does with an example whose features hold NaN or inf: refuse the data (DataError, the default)
#: or give that example a null output (NaN rows of a tensor; null values of a Spark column)
NON_FINITE_ACTIONS = ("error", "null")


def check_non_finite(owner: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` is one of `NON_FINITE_ACTIONS`."""
    check_choice("non_finite", value, NON_FINITE_ACTIONS, owner=owner)


def non_finite_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A ``(N,)`` bool tensor: the examples (rows along dimension 0) with a NaN or inf value in any of the
    floating-point ``tensors`` (integer ones, such as token ids, cannot hold either)."""
    bad = torch.zeros(tensors[0].shape[0], dtype=torch.bool, device=tensors[0].device)
    for t in tensors:
        if t.is_floating_point() and t.numel():
            bad |= ~torch.isfinite(t).reshape(t.shape[0], -1).all(dim=1)
    return bad


def non_finite_message(
    what: str, tensors: list[torch.Tensor], bad: torch.Tensor, row_name: Callable[[int], str]
) -> str:
    """The DataError text for rows ``bad`` of ``tensors`` holding NaN/inf: how many, the first one
    (``row_name(index)`` names it: ``"example 3"``, ``"key 'a'"``), its input and value, and the two fixes."""
    first = int(torch.nonzero(bad).flatten()[0])
    for k, t in enumerate(tensors):
        if t.is_floating_point():
            row = t[first].reshape(-1)
            cols = torch.nonzero(~torch.isfinite(row)).flatten()
            if cols.numel():
                col = int(cols[0])
                value = float(row[col])
                source = f"input {k} " if len(tensors) > 1 else ""
                return (
                    f"{what}: {int(bad.sum())} of {bad.numel()} examples have NaN or inf features; the first is "
                    f"{row_name(first)}, {source}value {col} (of {row.numel()}) is {value}. Drop or repair "
                    "those rows, or pass non_finite='null' to get a null output for them"
                )
    return f"{what}: {int(bad.sum())} examples have NaN or inf features; drop or repair them"


def output(
    net: ForwardNetwork,
    features: Any,
    train: bool = False,
    batch_size: int | None = None,
    non_finite: str = "error",
) -> Any:
    """Network outputs with the loss's output activation (softmax / sigmoid / identity).

    Args:
        net: the network.
        features: a tensor (or numpy array) of examples, a list of them for several inputs, or a dict of them
            for keyword inputs (``module(**features)``, e.g. ``{"input_ids": ids, "attention_mask": mask}``).
            PyTorch data (a ``DataLoader`` or ``Dataset``) goes through `predict` (``batch_size`` or 256 a batch).
        train: run in training mode (dropout active, batch-norm batch statistics) when True.
        batch_size: evaluate in chunks of this many examples to bound memory (None: all at once).
        non_finite: an example whose features hold NaN or inf: ``"error"`` (default) raises DataError naming
            it; ``"null"`` gives it NaN outputs (its features never reach the network: the other examples'
            outputs are what they would be without it).
    Returns:
        a tensor on the CPU, or a tuple of tensors for several outputs.
    Raises:
        ConfigError: an unknown ``non_finite``. DataError: NaN/inf features with ``non_finite="error"``.

    Example: ``probs = output(net, x_test, batch_size=1024)`` (``net.output(x_test, batch_size=1024)``).
    """
    check_non_finite("output", non_finite)
    if is_torch_data(features):
        if train or non_finite != "error":
            raise ConfigError(
                "output(train=True) and non_finite='null' take tensors, not a DataLoader or Dataset; "
                "predict over batches with net.predict(data) or pass the features as tensors"
            )
        return predict(net, features, batch_size or 256)
    names = tuple(features) if isinstance(features, Mapping) else None
    feats = [torch.as_tensor(f) for f in (list(features.values()) if names is not None else as_list(features))]
    bad = non_finite_rows(feats)
    nulls = bool(bad.any())
    if nulls:
        if non_finite == "error":
            raise DataError(non_finite_message("output", feats, bad, lambda i: f"example {i}"))
        keep = ~bad
        feats = [
            torch.where(keep.reshape(-1, *([1] * (f.dim() - 1))), f, torch.zeros((), dtype=f.dtype))
            if f.is_floating_point()
            else f
            for f in feats
        ]
    merged = _output(net, feats, train, batch_size, names)
    if nulls:
        merged = [m.masked_fill(bad.to(m.device).reshape(-1, *([1] * (m.dim() - 1))), float("nan")) for m in merged]
    return merged[0] if len(merged) == 1 else tuple(merged)


def _output(
    net: ForwardNetwork,
    feats: list[torch.Tensor],
    train: bool,
    batch_size: int | None,
    names: tuple[str, ...] | None = None,
) -> list[torch.Tensor]:
    """`output` of finite features, one CPU tensor per network output."""
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
            outs = forward(net, part, None, names)
            acts = [lo.activation(o) for lo, o in zip(losses_for(net, len(outs)), outs)]
            chunks.append([a.detach().cpu() for a in acts])
    return [torch.cat([c[k] for c in chunks]) for k in range(len(chunks[0]))]


#: what `predict` gives per example: the activated outputs, or the argmax class
PREDICT_OUTPUTS = ("probabilities", "class")


def predict(net: ForwardNetwork, data: Any, batch_size: int = 256, output: str = "probabilities") -> Any:
    """The network's outputs on every example of ``data``, in order, in evaluation mode without gradients.

    Args:
        data: a DataSet/MultiDataSet (in ``batch_size`` chunks), an iterable of them, or PyTorch data (a
            ``DataLoader``, ``Dataset`` or ``IterableDataset``, `torchspark.data.torchdata`); labels are ignored.
        output: ``"probabilities"`` (the loss's activation of the logits, as `output`) or ``"class"`` (the argmax
            over dimension 1 as int64; 0/1 at 0.5 for a 1-D output).
    Returns:
        a CPU tensor, or a tuple of them for several outputs.
    Raises:
        ConfigError: an unknown ``output``. DataError: no data, NaN/inf features, or a batch of a form not taken.

    Example: ``classes = predict(net, DataLoader(test_set, batch_size=64), output="class")``.
    """
    check_choice("output", output, PREDICT_OUTPUTS, owner="predict")
    net.module.eval()
    chunks: list[list[torch.Tensor]] = []
    with torch.no_grad():
        for batch in iterate_minibatches(data, batch_size):
            batch.check_finite("predict features")
            feats, _, fmask, _ = unpack(net, batch)
            outs = forward(net, feats, fmask, feature_names(batch))
            chunks.append([lo.activation(o).cpu() for lo, o in zip(losses_for(net, len(outs)), outs)])
    if not chunks:
        raise DataError("predict got no data: the DataSet or iterable is empty")
    merged = [torch.cat([c[k] for c in chunks]) for k in range(len(chunks[0]))]
    if output == "class":
        merged = [m.argmax(dim=1) if m.dim() > 1 else (m >= 0.5).to(torch.int64) for m in merged]
    return merged[0] if len(merged) == 1 else tuple(merged)


def batch_losses(net: ForwardNetwork, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per_example_loss, weight)`` of one batch in the current mode, without gradients being required:
    the loss summed over outputs per example, and each example's weight (0 where every label is masked).

    Raises:
        DataError: a batch without labels, or labels that do not fit the outputs.
    """
    feats, labels, fmask, lmasks = unpack(net, batch)
    if uses_model_loss(net.losses):  # the module's mean loss, spread over the batch's examples
        outputs, own = model_loss(net, batch, feats, labels, fmask, lmasks)
        n = outputs[0].shape[0]
        return own.detach().expand(n), torch.ones(n, device=own.device)
    if labels is None:
        raise DataError("scoring needs labels, but the batch has labels=None")
    outputs = forward(net, feats, fmask, feature_names(batch))
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
