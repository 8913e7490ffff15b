"""The fused hot path of gradient sharing: the updater's step lands in the residual instead of the parameters.

Steps 1 + 2a of a round (compute the update, add it to the residual) in one pass over the parameters:
`step_into_residual` either lets the updater step straight into the residual (`train_step_into`,
when `can_step_into`), or takes one updater step and moves it into the residual while restoring the
parameters ([`accumulate_step`][torchspark.encoding.accumulate_step]). Then ``encode_step(None, ...)`` encodes the residual as
it stands. `can_fuse` says when this does exactly what ``compute_update`` + ``encode_step(update, ...)``
would.

Example::

    if can_fuse(state, net):
        update_norm, param_norm = step_into_residual(state, net, batch, validate=False)
        message, state.encoder = encode_step(None, state.encoder, step)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from torchspark.data import Batch, as_group
from torchspark.encoding import accumulate_step
from torchspark.errors import ConfigError
from torchspark.nn import Network
from torchspark.optim import UpdaterSpec
from torchspark.training.algorithms.sharing.state import SharingState

__all__ = ["PARAM_NORM_EVERY", "can_step_into", "parameter_views", "train_step_into", "can_fuse", "step_into_residual"]

#: steps between two computations of the parameters' norm for the divergence check on the direct path
PARAM_NORM_EVERY = 16


def can_step_into(net: Network) -> bool:
    """Whether `train_step_into` may be used on ``net``: one of torchspark's updaters (their step never reads
    the parameter values), no ``weight_decay`` (the decay term does), float32 parameters in the contiguous
    layout."""
    return (
        isinstance(net.updater, UpdaterSpec)
        and net.weight_decay == 0.0
        and net.memory_format == "contiguous"
        and net.params_view().dtype == torch.float32
    )


def parameter_views(net: Network, target: torch.Tensor) -> list[torch.Tensor]:
    """``target`` (flat, ``net.num_params()`` values) cut into one view per parameter, shaped like it, in
    ``module.parameters()`` order (the flat layout of the contiguous format)."""
    views, offset = [], 0
    for p in net.module.parameters():
        views.append(target[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


class _StepInto:
    """The optimizer hooks of `train_step_into`: for the duration of the updater's step every parameter's data
    is its view of the target and the learning rate is negated; `undo` puts both back."""

    def __init__(self, params: list[torch.nn.Parameter], views: list[torch.Tensor]) -> None:
        self.params = params
        self.views = views
        self.saved: tuple[list[torch.Tensor], list[dict[str, Any]], list[Any]] | None = None

    def before(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        groups = optimizer.param_groups
        rates = [g["lr"] for g in groups]
        self.saved = ([p.data for p in self.params], groups, rates)
        for p, v in zip(self.params, self.views):
            p.data = v
        for g, lr in zip(groups, rates):
            g["lr"] = -lr

    def after(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.undo()

    def undo(self) -> None:
        if self.saved is None:
            return
        real, groups, rates = self.saved
        self.saved = None
        for p, r in zip(self.params, real):
            p.data = r
        for g, lr in zip(groups, rates):
            g["lr"] = lr


def train_step_into(
    net: Network,
    target: torch.Tensor,
    batch: Batch | Sequence[Batch],
    validate: bool = False,
    views: list[torch.Tensor] | None = None,
) -> float:
    """``net.train_step(batch)`` (``net.train_group`` for a group of micro-batches) whose updater step lands in
    ``target`` instead of the parameters: ``target += u``,
    where ``u`` is the step the updater would have subtracted from the parameters; the parameters do not move, the
    updater state, counters and score advance as in ``train_step``. Returns the loss. One pass instead of
    snapshot-step-subtract-restore (what ``compute_update`` does); ``u`` equals ``compute_update``'s result up to
    the rounding of ``(p - (p - u))``.

    How: for the duration of the updater's step every parameter's data is the matching view of ``target`` and the
    learning rate is negated (``target -= (-lr) * direction``), which is exact for updaters whose step does not
    read the parameter values (`can_step_into`).

    Mixed precision (``net.precision``) needs nothing here: the forward pass runs under the network's autocast,
    the parameters and ``target`` stay float32, and a step fp16's scaler skips (overflowing gradients) never calls
    the updater, so ``target`` is left as it was (a zero update).

    Args:
        views: ``parameter_views(net, target)``, when the caller keeps them across steps (the same target every
            step: a sharing residual); built here when None.

    Raises:
        ConfigError: `can_step_into` is False, or ``target`` is not a float32 tensor of ``num_params()``
            values on the network's device.
    """
    if not can_step_into(net):
        raise ConfigError(
            "train_step_into needs one of torchspark's updaters, weight_decay=0, float32 parameters "
            "and memory_format='contiguous'; use compute_update"
        )
    flat = net.params_view()
    if (
        target.dim() != 1
        or target.numel() != flat.numel()
        or target.dtype != torch.float32
        or target.device != flat.device
    ):
        raise ConfigError(
            f"train_step_into needs a 1-D float32 tensor of {flat.numel()} values on "
            f"{flat.device}, got {tuple(target.shape)} {target.dtype} on {target.device}"
        )
    swap = _StepInto(list(net.module.parameters()), views if views is not None else parameter_views(net, target))
    before = net.optimizer.register_step_pre_hook(swap.before)
    after = net.optimizer.register_step_post_hook(swap.after)
    try:
        return net.train_group(as_group(batch), validate)
    finally:
        before.remove()
        after.remove()
        swap.undo()  # the step raised: the post hook did not run


def can_fuse(state: SharingState, net: Network) -> bool:
    """Whether `step_into_residual` + ``encode_step(None, ...)`` does exactly what ``compute_update`` +
    ``encode_step(update, ...)`` would: the encoder will not calibrate from this update, and float32 parameters."""
    encoder = state.encoder
    return net.params_view().dtype == torch.float32 and (
        encoder.threshold_state.calibrated or encoder.config.threshold_policy.calibration_target() is None
    )


def step_into_residual(
    state: SharingState, net: Network, batch: Batch | Sequence[Batch], validate: bool
) -> tuple[float, float]:
    """Steps 1 + 2a fused. When the network can (`can_step_into`) the updater steps straight into the
    residual and ``(norm(residual), norm(params))`` is returned for the divergence check; otherwise one updater
    step, then in one pass ``u = before - after``, the parameters restored and ``residual += u``
    ([`accumulate_step`][torchspark.encoding.accumulate_step], bit-identical to ``compute_update`` followed by the encoder's
    add), returning ``(norm(u), norm(params))``. Exact torch norms when one is not finite, so the message is the
    unfused path's."""
    flat = net.params_view()
    if can_step_into(net):  # the updater steps straight into the residual: no snapshot, no restore
        residual = state.encoder.residual
        if state.residual_views is None or state.residual_views[0] is not residual:
            state.residual_views = (residual, parameter_views(net, residual))
        train_step_into(net, residual, batch, validate, state.residual_views[1])
        # the residual after the add stands in for the update's norm: it differs from it by the residual before
        # the step, which the threshold and the residual post-processor keep at a few thresholds per entry
        update_norm = math.sqrt(float(torch.dot(residual, residual)))
        # the parameters move only by the exchanged +-t steps, a tiny fraction of their norm per step: a norm up to
        # PARAM_NORM_EVERY - 1 steps old judges "the update is 1000x the parameters" the same (one pass saved)
        if state.param_norm is None or state.steps % PARAM_NORM_EVERY == 0 or not math.isfinite(state.param_norm):
            state.param_norm = math.sqrt(float(torch.dot(flat, flat)))
        param_norm = state.param_norm
        if not (math.isfinite(update_norm) and math.isfinite(param_norm)):
            update_norm, param_norm = float(residual.norm()), float(flat.norm())
        return update_norm, param_norm
    if state.step_buffers is None:
        state.step_buffers = (torch.empty_like(flat), torch.empty_like(flat))
    before, update = state.step_buffers
    with torch.no_grad():
        before.copy_(flat)
    net.train_group(as_group(batch), validate)
    update_norm, param_norm = accumulate_step(state.encoder.residual, before, flat, update)
    if not (math.isfinite(update_norm) and math.isfinite(param_norm)):
        update_norm, param_norm = float(update.norm()), float(before.norm())
    return update_norm, param_norm
