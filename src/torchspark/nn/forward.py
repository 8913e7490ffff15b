"""A network's forward pass: a batch in, outputs and per-example losses out, and the checks that turn PyTorch's
shape and dtype errors into messages naming the data and the fix.

The module is called ``module(*features)``, or ``module(**features)`` for keyword features (a
[`MultiDataSet`][torchspark.MultiDataSet] with ``feature_names``, e.g. ``input_ids`` and ``attention_mask``). It may
return what PyTorch users write (`read_outputs`): a tensor (the logits), a tuple of tensors (one per output), a dict
with ``"logits"`` or an object with a ``logits`` attribute (a Hugging Face ``ModelOutput``). With ``loss=None`` the
network trains on the module's own loss: the labels go in as ``labels=`` and the module's ``loss`` comes back.

[`Network`][torchspark.Network] trains, scores and predicts through these functions, and
`torchspark.nn.outputs` evaluates several outputs through them; both hand in the network, read through
`ForwardNetwork` (what this module needs of it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, Union

import torch

from torchspark.data import DataSet, MultiDataSet
from torchspark.errors import ConfigError, DataError, TorchSparkError
from torchspark.nn.losses import Loss, uses_model_loss
from torchspark.nn.precision import Precision

__all__ = [
    "ForwardNetwork",
    "Batch",
    "Unpacked",
    "as_list",
    "unpack",
    "feature_names",
    "forward",
    "forward_with_loss",
    "read_outputs",
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


def feature_names(batch: Batch) -> tuple[str, ...] | None:
    """The keyword names of ``batch``'s features (``module(**features)``), or None for positional features."""
    return getattr(batch, "feature_names", None)


_OUTPUT_FORMS = (
    "return a tensor of logits, a tuple of tensors (one per output), a dict with a 'logits' entry or an object "
    "with a logits attribute (a Hugging Face ModelOutput)"
)


def read_outputs(module: torch.nn.Module, out: Any, own_loss: bool) -> tuple[list[Any], Any]:
    """``(outputs, loss)`` of what the module returned: its logits as a list (one per output) and the loss it
    computed itself (None when it gave none).

    * a tensor: the logits of the one output;
    * a dict (a Hugging Face ``ModelOutput`` is one) with ``"logits"``, or an object with a ``logits`` attribute:
      the logits (a tuple of them for several outputs) and its ``loss`` entry or attribute;
    * a tuple or list: one tensor per output; with the model's own loss (``own_loss``) it is Hugging Face's
      ``return_dict=False`` form, ``(loss, logits, ...)`` when the first item is a scalar, else ``(logits, ...)``
      (what follows the logits, hidden states or attentions, is not an output).

    Raises:
        ConfigError: anything else (the message names the type and the forms accepted).
    """
    name = type(module).__name__
    loss: Any = None
    if isinstance(out, torch.Tensor):
        return [out], None
    if isinstance(out, Mapping):
        if "logits" not in out:
            raise ConfigError(
                f"{name}.forward returned a dict with keys {sorted(map(str, out))} and no 'logits'; {_OUTPUT_FORMS}"
            )
        logits, loss = out["logits"], out.get("loss")
    elif hasattr(out, "logits"):
        logits, loss = out.logits, getattr(out, "loss", None)
    elif isinstance(out, (tuple, list)):
        items = list(out)
        if own_loss:
            if len(items) >= 2 and isinstance(items[0], torch.Tensor) and items[0].dim() == 0:
                loss, items = items[0], items[1:]
            items = items[:1]
        logits = items
    else:
        raise ConfigError(f"{name}.forward returned a {type(out).__name__}; {_OUTPUT_FORMS}")
    outputs = as_list(logits)
    bad = [type(o).__name__ for o in outputs if not isinstance(o, torch.Tensor)]
    if not outputs or bad:
        raise ConfigError(f"{name}.forward returned logits of type {bad or 'nothing'}, not tensors; {_OUTPUT_FORMS}")
    return outputs, loss


def forward(
    net: ForwardNetwork, feats: list[torch.Tensor], fmask: Any = None, names: Sequence[str] | None = None
) -> list[torch.Tensor]:
    """The module's outputs (logits) as a list, one per output, for the `unpack`-ed features.

    ``names`` (`feature_names` of the batch) calls ``module(**dict(zip(names, feats)))`` instead of
    ``module(*feats)``. The module runs under the network's autocast (``precision``); outputs are float32
    whatever the precision, so losses, evaluations and predictions are computed in float32.

    Raises:
        DataError: features of a shape or dtype the module cannot take (the message names them and the fix).
        ConfigError: a ``forward`` that calls ``.view()`` where the memory layout does not allow it; an output
            that is not one of the forms `read_outputs` reads.
    """
    return forward_with_loss(net, feats, fmask, names)[0]


def forward_with_loss(
    net: ForwardNetwork,
    feats: list[torch.Tensor],
    fmask: Any = None,
    names: Sequence[str] | None = None,
    labels: list[torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """`forward`, also returning the loss the module computed itself (None when it returned none).

    ``labels`` (given with the model's own loss, ``loss=None``) go to the module as ``labels=`` (one array, or a
    list for several)."""
    kwargs: dict[str, Any] = {}
    if fmask is not None:
        kwargs["features_mask"] = fmask.to(net.device, non_blocking=True) if isinstance(fmask, torch.Tensor) else fmask
    if labels is not None:
        kwargs["labels"] = labels[0] if len(labels) == 1 else labels
    args: list[torch.Tensor] = feats
    if names is not None:
        kwargs.update(zip(names, feats))
        args = []
    try:
        with net.amp.autocast():
            out = net.forward_module(*args, **kwargs)
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
        if labels is not None and isinstance(e, TypeError) and "'labels'" in text:
            raise ConfigError(
                f"loss=None trains on the model's own loss, passing the labels as labels=..., but "
                f"{type(net.module).__name__}.forward takes no labels ({text.splitlines()[0]}); pass "
                "loss='cross_entropy' (or another loss) to Network to compute the loss from the logits, or "
                "give forward a labels argument and return the loss"
            ) from e
        if names is not None and isinstance(e, TypeError) and "argument" in text:
            raise DataError(
                f"the network ({type(net.module).__name__}) cannot take the keyword features {list(names)}: "
                f"{text.splitlines()[0]}. Name the batch's dict keys after the arguments of its forward"
            ) from e
        raise DataError(
            f"the network ({type(net.module).__name__}) cannot take features of shape {shapes}: {e}. "
            "Check the feature shape (reshape the data or build the model for this input size)."
        ) from e
    outputs, loss = read_outputs(net.module, out, uses_model_loss(net.losses))
    return net.amp.to_float32(outputs), (None if loss is None else net.amp.to_float32([loss])[0])


def losses_for(net: ForwardNetwork, n_outputs: int) -> list[Loss]:
    """The loss of each of ``n_outputs`` outputs: one per output, or the single loss repeated."""
    if len(net.losses) == n_outputs:
        return net.losses
    if len(net.losses) == 1:
        return net.losses * n_outputs
    raise ConfigError(f"the network has {n_outputs} outputs but {len(net.losses)} losses were given")


def check_labels(net: ForwardNetwork, outputs: list[torch.Tensor], labels: list[torch.Tensor]) -> None:
    """DataError (naming the output, the shapes and the fix) unless every label array fits its output and loss."""
    if uses_model_loss(net.losses):
        return  # the module's own loss reads its labels (Hugging Face's -100 for "ignore", token labels, ...)
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
    if uses_model_loss(net.losses):
        if validate:
            batch.check_finite("training features")
        outputs, own = model_loss(net, batch, feats, labels, fmask, lmasks)
        return own, outputs[0].shape[0]
    if labels is None:
        raise DataError(
            "training and scoring need labels, but the batch has labels=None; pass "
            "DataSet(features, labels) (predict with net.output(features) needs none)"
        )
    if validate:
        batch.check_finite("training features")
    outputs = forward(net, feats, fmask, feature_names(batch))
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


def model_loss(
    net: ForwardNetwork, batch: Batch, feats: list[torch.Tensor], labels: Any, fmask: Any, lmasks: Any
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``(outputs, mean loss)`` of one batch under the model's own loss (``loss=None``): the labels go to the module
    as ``labels=``, the scalar loss it returns is the batch's mean loss (a per-example one is averaged).

    Raises:
        DataError: a batch without labels, or with label masks (the module's loss cannot take them).
        ConfigError: the module returned no loss.
    """
    name = type(net.module).__name__
    if labels is None:
        raise DataError(
            f"loss=None trains on the loss {name} computes itself from labels=..., but the batch has no labels; "
            "give the batch a 'labels' entry (a dict batch), a (features, labels) tuple or DataSet(features, labels)"
        )
    if lmasks is not None:
        raise DataError(
            "label masks are not supported with loss=None (the model's own loss cannot take them); mask in the "
            "model (e.g. labels of -100 for Hugging Face models) or pass a named loss"
        )
    outputs, own = forward_with_loss(net, feats, fmask, feature_names(batch), labels)
    if own is None:
        raise ConfigError(
            f"loss=None trains on the model's own loss, but {name}.forward(..., labels=...) returned no loss "
            "(no 'loss' entry or attribute, or None); pass loss='cross_entropy' (or 'mse', 'bce_with_logits', a "
            "callable) to Network to compute the loss from the logits, or have the module return its loss"
        )
    if not isinstance(own, torch.Tensor):
        raise ConfigError(f"{name}.forward returned a loss of type {type(own).__name__}; return a tensor")
    return outputs, own.mean() if own.dim() else own
