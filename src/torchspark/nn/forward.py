"""A network's forward pass: a batch in, outputs and per-example losses out, and the checks that turn PyTorch's
shape and dtype errors into messages naming the data and the fix.

[`Network`][torchspark.Network] trains, scores and predicts through these functions, and
`torchspark.nn.outputs` evaluates several outputs through them; both hand in the network, read through
`ForwardNetwork` (what this module needs of it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, Union

import torch

from torchspark.data import DataSet, MultiDataSet
from torchspark.errors import ConfigError, DataError, TorchSparkError
from torchspark.nn.losses import Loss
from torchspark.nn.precision import Precision

__all__ = [
    "ForwardNetwork",
    "Batch",
    "Unpacked",
    "as_list",
    "unpack",
    "forward",
    "losses_for",
    "check_labels",
    "per_example_losses",
    "batch_loss",
]

Batch = Union[DataSet, MultiDataSet]
#: ``(features, labels or None, features mask, labels masks)``
Unpacked = tuple[list[torch.Tensor], Union[list[torch.Tensor], None], Any, Any]


class ForwardNetwork(Protocol):
    """What the forward pass reads of a network ([`Network`][torchspark.Network] provides it)."""

    module: torch.nn.Module
    #: what the forward pass calls: ``module``, or its compiled form (`torchspark.nn.compiled`)
    forward_module: Callable[..., Any]
    losses: list[Loss]
    device: torch.device
    memory_format: str
    amp: Precision

    def params_view(self) -> torch.Tensor: ...


def as_list(x: Any) -> list[Any]:
    """``x`` as a list: a list or tuple unchanged in content, anything else wrapped (``as_list(t) == [t]``)."""
    return list(x) if isinstance(x, (list, tuple)) else [x]


#: fragments of PyTorch's messages when a module gets inputs of the wrong shape, count, type or index range
_INPUT_MISMATCH = (
    "shape",
    "size",
    "dimension",
    "channels",
    "mat1",
    "expected",
    "must match",
    "argument",
    "index",
    "dtype",
    "scalar type",
)


def _looks_like_input_mismatch(message: str) -> bool:
    lower = message.lower()
    return "out of memory" not in lower and any(h in lower for h in _INPUT_MISMATCH)


def _check_label_shape(k: int, out: torch.Tensor, lab: torch.Tensor, loss: Loss) -> None:
    """Labels whose shape the built-in loss cannot take: a DataError naming the loss, both shapes and the fix
    (instead of torch's "0D or 1D target tensor expected" or "shape ... is invalid")."""
    if loss.name == "cross_entropy" and out.dim() == 2:
        indices = lab.dim() == 1 and not lab.is_floating_point()
        if indices:  # the usual case, decided without building the message (this runs every training step)
            return
        got = _labels_text(lab)
        dense = lab.dim() == 2 and lab.is_floating_point() and lab.shape[1] == out.shape[1]
        if not (indices or dense) and lab.dim() == 2 and lab.shape[1] == 1:
            raise DataError(
                f"loss 'cross_entropy' (output {k}, {out.shape[1]} classes) takes class indices of shape "
                f"(N,) as integers or one-hot targets (N, {out.shape[1]}), got {got}; flatten the labels "
                "to integer class indices (labels.reshape(-1).astype('int64'))"
            )
        if not (indices or dense) and lab.dim() == 2:
            raise DataError(
                f"loss 'cross_entropy' (output {k}) needs one-hot targets of shape (N, {out.shape[1]}) "
                f"or class indices (N,), got {got}; match the number of classes or rebuild the model"
            )
    elif loss.name in ("mse", "bce_with_logits") and lab.numel() != out.numel():
        got = _labels_text(lab)
        fix = (
            (
                f"one-hot encode class indices (torch.nn.functional.one_hot(labels, {out.shape[1]})) or use "
                "loss='cross_entropy'"
            )
            if not lab.is_floating_point() and lab.dim() == 1 and out.dim() == 2
            else "give labels of the outputs' shape"
        )
        raise DataError(
            f"loss {loss.name!r} (output {k}) needs labels shaped like the outputs {tuple(out.shape)}, got {got}; {fix}"
        )


def _labels_text(lab: torch.Tensor) -> str:
    return f"labels of shape {tuple(lab.shape)} ({str(lab.dtype).replace('torch.', '')})"


def unpack(net: ForwardNetwork, batch: Batch) -> Unpacked:
    """``(features, labels, features_mask, labels_masks)`` of a batch, features and labels on the network's device.

    Floating features take the parameters' dtype; labels is None for an unlabelled batch.

    Example: ``feats, labels, fmask, lmasks = unpack(net, DataSet(x, y))``.
    """
    fmask: Any  # one mask (DataSet) or one per features array (MultiDataSet); lmasks likewise
    lmasks: Any
    if isinstance(batch, DataSet):
        feats = [batch.features]
        labels = None if batch.labels is None else [batch.labels]
        fmask = batch.features_mask
        lmasks = None if batch.labels_mask is None else [batch.labels_mask]
    elif isinstance(batch, MultiDataSet):
        feats = list(batch.features)
        labels = None if batch.labels is None else list(batch.labels)
        fmask = batch.features_masks
        lmasks = batch.labels_masks
    else:
        raise DataError(f"expected a DataSet or MultiDataSet, got {type(batch).__name__}")
    dev = net.device
    # floating features take the parameters' dtype (numpy's float64 default meets a float32 network); integer
    # features (token ids) stay as they are
    dtype = net.params_view().dtype
    feats = [f.to(dev, dtype=dtype if f.is_floating_point() else f.dtype, non_blocking=True) for f in feats]
    if labels is not None:
        labels = [lab.to(dev, non_blocking=True) for lab in labels]
    return feats, labels, fmask, lmasks


def forward(net: ForwardNetwork, feats: list[torch.Tensor], fmask: Any = None) -> list[torch.Tensor]:
    """The module's outputs (logits) as a list, one per output, for the `unpack`-ed features.

    The module runs under the network's autocast (``precision``); outputs are float32 whatever the precision, so
    losses, evaluations and predictions are computed in float32.

    Raises:
        DataError: features of a shape or dtype the module cannot take (the message names them and the fix).
        ConfigError: a ``forward`` that calls ``.view()`` where the memory layout does not allow it.
    """
    kwargs: dict[str, Any] = {}
    if fmask is not None:
        kwargs["features_mask"] = fmask.to(net.device, non_blocking=True) if isinstance(fmask, torch.Tensor) else fmask
    try:
        with net.amp.autocast():
            out = net.forward_module(*feats, **kwargs)
    except TorchSparkError:
        raise  # already says what to change (a compile backend that cannot run here)
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        text = str(e)
        if "view size is not compatible" in text:
            raise ConfigError(
                f"{type(net.module).__name__}.forward calls .view() on a tensor whose layout does not allow it "
                f"({text.splitlines()[0]}); use .reshape() or .flatten() there"
                + (", or memory_format='contiguous'" if net.memory_format != "contiguous" else "")
            ) from e
        if not _looks_like_input_mismatch(text):
            raise  # e.g. out of memory, or a bug in the module: not the data's fault
        shapes = ", ".join(str(tuple(f.shape)) for f in feats)
        if "dtype" in text.lower() or "expected scalar type" in text.lower():
            dtypes = ", ".join(str(f.dtype).replace("torch.", "") for f in feats)
            param_dtype = str(net.params_view().dtype).replace("torch.", "")
            raise DataError(
                f"the network ({type(net.module).__name__}) cannot take features of dtype {dtypes} (shape "
                f"{shapes}); its parameters are {param_dtype}: {text.splitlines()[0]}. "
                "Cast the features (e.g. features.astype('float32')) or embed integer inputs in the model"
            ) from e
        raise DataError(
            f"the network ({type(net.module).__name__}) cannot take features of shape {shapes}: {e}. "
            "Check the feature shape (reshape the data or build the model for this input size)."
        ) from e
    return net.amp.to_float32(as_list(out))


def losses_for(net: ForwardNetwork, n_outputs: int) -> list[Loss]:
    """The loss of each of ``n_outputs`` outputs: one per output, or the single loss repeated."""
    if len(net.losses) == n_outputs:
        return net.losses
    if len(net.losses) == 1:
        return net.losses * n_outputs
    raise ConfigError(f"the network has {n_outputs} outputs but {len(net.losses)} losses were given")


def check_labels(net: ForwardNetwork, outputs: list[torch.Tensor], labels: list[torch.Tensor]) -> None:
    """DataError (naming the output, the shapes and the fix) unless every label array fits its output and loss."""
    if len(labels) != len(outputs):
        raise DataError(f"the data has {len(labels)} label arrays but the network has {len(outputs)} outputs")
    for k, (out, lab, loss) in enumerate(zip(outputs, labels, losses_for(net, len(outputs)))):
        _check_label_shape(k, out, lab, loss)
        if loss.classification and not lab.is_floating_point() and out.dim() >= 2 and lab.numel():
            lo, hi = (int(v) for v in torch.aminmax(lab))  # one pass over the labels, not two
            if lo < 0 or hi >= out.shape[1]:
                bad = hi if hi >= out.shape[1] else lo
                raise DataError(
                    f"label index {bad} is out of range for output {k} with {out.shape[1]} classes; "
                    f"labels must be in [0, {out.shape[1] - 1}] (or build the model with more outputs)"
                )


def per_example_losses(
    net: ForwardNetwork, outputs: list[torch.Tensor], labels: list[torch.Tensor], lmasks: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed per-example loss over outputs ``(N,)`` and per-example weights ``(N,)`` (from label masks)."""
    total: torch.Tensor | None = None
    weight = torch.ones(outputs[0].shape[0], device=net.device)
    for k, (out, lab, loss) in enumerate(zip(outputs, labels, losses_for(net, len(outputs)))):
        per = loss.per_example(out, lab)
        if lmasks is not None and lmasks[k] is not None:
            m = lmasks[k].to(net.device, dtype=per.dtype)
            m = m.reshape(m.shape[0], -1).amax(dim=1) if m.dim() > 1 else m
            per = per * m
            weight = torch.minimum(weight, m) if k else m
        total = per if total is None else total + per
    assert total is not None
    return total, weight


def batch_loss(net: ForwardNetwork, batch: Batch, validate: bool) -> tuple[torch.Tensor, int]:
    """``(mean loss, examples)`` of one labelled batch in the module's current mode, with its autograd graph.

    ``validate`` also checks the features for NaN/Inf first (the first batch of an epoch).
    """
    feats, labels, fmask, lmasks = unpack(net, batch)
    if labels is None:
        raise DataError(
            "training and scoring need labels, but the batch has labels=None; pass "
            "DataSet(features, labels) (predict with net.output(features) needs none)"
        )
    if validate:
        batch.check_finite("training features")
    outputs = forward(net, feats, fmask)
    check_labels(net, outputs, labels)
    examples = outputs[0].shape[0]
    if lmasks is None:  # every weight is 1: their sum is the example count, no weight tensor to build and reduce
        loss = _summed_losses(net, outputs, labels).sum() / max(examples, 1)
    else:
        per, weight = per_example_losses(net, outputs, labels, lmasks)
        loss = per.sum() / weight.sum().clamp(min=1.0)
    return loss, examples


def _summed_losses(net: ForwardNetwork, outputs: list[torch.Tensor], labels: list[torch.Tensor]) -> torch.Tensor:
    """`per_example_losses` without label masks: the per-example loss summed over outputs ``(N,)``."""
    total: torch.Tensor | None = None
    for out, lab, loss in zip(outputs, labels, losses_for(net, len(outputs))):
        per = loss.per_example(out, lab)
        total = per if total is None else total + per
    assert total is not None
    return total
