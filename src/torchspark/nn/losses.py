"""Loss functions by name, with their per-example form and the output activation they imply.

``cross_entropy`` takes class indices ``(N,)`` or one-hot/probability targets ``(N, C)`` and gives softmax
outputs; ``bce_with_logits`` takes 0/1 targets ``(N, k)`` and gives sigmoid outputs; ``mse`` gives raw outputs.
A custom loss is a callable ``(logits, labels) -> per-example losses (N,)`` or a scalar, or an import path
``"package.module:function"`` (which also saves as JSON). ``None`` (or ``"model"``) is the model's own loss,
Hugging Face style: the module gets the labels as ``labels=`` and returns ``.loss`` / ``["loss"]`` with its logits
(`torchspark.nn.forward`); its outputs are read as class logits (softmax).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import torch
import torch.nn.functional as F

from torchspark.errors import ConfigError
from torchspark.nn.spec import import_object

__all__ = ["Loss", "resolve_loss", "LOSSES", "MODEL_LOSS", "uses_model_loss", "resolve_losses"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if labels.is_floating_point():
        return F.cross_entropy(logits, labels.to(logits.dtype), reduction="none")
    return F.cross_entropy(logits, labels, reduction="none")


def _per_example_mean(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1).mean(dim=1) if x.dim() > 1 else x


def _mse(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    labels = labels.to(outputs.dtype).reshape(outputs.shape)
    return _per_example_mean(F.mse_loss(outputs, labels, reduction="none"))


def _bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    labels = labels.to(logits.dtype).reshape(logits.shape)
    return _per_example_mean(F.binary_cross_entropy_with_logits(logits, labels, reduction="none"))


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=1) if x.dim() > 1 else torch.sigmoid(x)


@dataclass(frozen=True)
class Loss:
    """A named loss: per-example function, output activation, and whether labels are class indices."""

    name: str
    per_example: LossFn
    activation: Callable[[torch.Tensor], torch.Tensor]
    classification: bool

    def to_json_value(self) -> str | None:
        """The name (or import path) to store in a saved config, or None when only pickle can store it."""
        return self.name if self.name in LOSSES or ":" in self.name else None


def _own_loss_only(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The per-example form of ``MODEL_LOSS``: never called, the forward pass reads the model's loss instead."""
    raise ConfigError(
        "loss=None (the model's own loss) has no per-example form of its own; the network reads the loss the "
        "module returns (outputs.loss). Pass loss='cross_entropy' (or another loss) to compute it from the logits"
    )


#: ``loss=None``: the loss the module computes itself from ``labels=`` (Hugging Face style)
MODEL_LOSS = Loss("model", _own_loss_only, _softmax, True)

LOSSES: dict[str, Loss] = {
    "cross_entropy": Loss("cross_entropy", _cross_entropy, _softmax, True),
    "mse": Loss("mse", _mse, lambda x: x, False),
    "bce_with_logits": Loss("bce_with_logits", _bce, torch.sigmoid, False),
    "model": MODEL_LOSS,
}

LossLike = Union[str, LossFn, Loss, None]


def uses_model_loss(losses: list[Loss]) -> bool:
    """Whether the network trains on the module's own loss (``loss=None``).

    Raises:
        ConfigError: the model's own loss mixed with other losses (it is the one loss of the whole model).
    """
    if not any(lo is MODEL_LOSS for lo in losses):
        return False
    if len(losses) > 1:
        raise ConfigError(
            f"loss=None (the model's own loss) covers the whole model and cannot be combined with other losses, "
            f"got {[lo.name for lo in losses]}; pass loss=None alone, or one named loss per output"
        )
    return True


def _wrap_callable(name: str, fn: LossFn) -> Loss:
    def per_example(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        value = fn(outputs, labels)
        if value.dim() == 0:  # a reduced loss: spread it so means and masks still work
            return value.expand(outputs.shape[0])
        return _per_example_mean(value)

    return Loss(name, per_example, lambda x: x, False)


def resolve_loss(loss: LossLike, importer: Callable[[str], Any] = import_object) -> Loss:
    """A registered name, an import path, a callable, a [`Loss`][torchspark.nn.Loss], or None (the model's own loss).

    ``importer`` turns an import path into the function; loading a saved network passes one that only allows
    what the caller trusts (`CodePolicy`) instead of importing whatever a file names.
    """
    if isinstance(loss, Loss):
        return loss
    if loss is None:
        return MODEL_LOSS
    if isinstance(loss, str):
        if loss in LOSSES:
            return LOSSES[loss]
        if ":" in loss:
            return _wrap_callable(loss, importer(loss))
        raise ConfigError(
            f"unknown loss {loss!r}; choose one of {sorted(LOSSES)}, an import path 'pkg.mod:fn', or a callable"
        )
    if callable(loss):
        return _wrap_callable("callable " + getattr(loss, "__qualname__", "loss"), loss)
    raise ConfigError(f"loss must be a name, an import path or a callable, got {loss!r}")


def resolve_losses(losses: list[LossLike]) -> list[Loss]:
    """`resolve_loss` of each; ConfigError when the model's own loss (None) is mixed with others."""
    resolved = [resolve_loss(lo) for lo in losses]
    uses_model_loss(resolved)
    return resolved
