"""When training has diverged, and the one message every route gives for it.

Parameter averaging notices divergence when a worker's loss turns NaN or infinite (the network refuses to step on
it). Gradient sharing can diverge without ever seeing a NaN loss: threshold encoding sends at most ``±threshold``
per parameter and step, so a huge learning rate blows the parameters up by a large but finite amount, the loss
stays finite and the fit ends at chance accuracy. So the sharing loop also checks every update it encodes
(`update_divergence`): an update that is not finite, or whose norm exceeds `MAX_UPDATE_RATIO` times
the parameters' norm (at least 1), is divergence. Healthy training moves the parameters by ~1e-3 of their norm
per step; a step a thousand times larger than the parameters themselves is never learning.

A gradient that is not finite while the loss is (`NonFiniteGradient`, raised by the network's step before
the updater sees it) is not divergence but a fault of the data or the model: a log or a division of 0, a sqrt at 0,
NaN/inf in the features or labels. Its message (`non_finite_gradient_message`) says so, not "lower the
learning rate"; gradient sharing with ``"warn"`` skips such a step (nothing enters the residual or the updater
state) and counts it.

What happens then is ``on_divergence`` (`DIVERGENCE_ACTIONS`): ``"fail"`` (default) raises
[`TrainingError`][torchspark.errors.TrainingError] with `diverged_message`; ``"warn"`` logs it once per worker and
fit, the fit goes on, and the driver warns with the same text after the fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchspark.errors import DataError, TrainingError
from torchspark.validation import check_choice

__all__ = [
    "DIVERGENCE_ACTIONS",
    "MAX_UPDATE_RATIO",
    "NonFiniteGradient",
    "check_gradient",
    "diverged_message",
    "non_finite_gradient_message",
    "update_divergence",
    "check_on_divergence",
]

#: what a fit does when training diverges: raise (default) or warn and go on
DIVERGENCE_ACTIONS = ("fail", "warn")

#: an update whose norm exceeds this many times the parameters' norm (at least 1) is divergence
MAX_UPDATE_RATIO = 1e3


def diverged_message(what: str, iteration: int, updater: Any) -> str:
    """The advice every route gives when training diverged: ``what`` happened, at which step, and the fix."""
    return (
        f"{what} at iteration {iteration}; the updater diverged. Lower the learning rate (updater={updater!r}) "
        "or set gradient_clip."
    )


class NonFiniteGradient(TrainingError):
    """A training step's gradient holds NaN or inf while its loss is finite; the updater did not step.

    Attributes:
        iteration: the network's iteration counter at the step.
        loss: the step's (finite) loss.
        bad: how many gradient entries are NaN or inf.
    """

    def __init__(self, message: str, iteration: int, loss: float, bad: int) -> None:
        super().__init__(message)
        self.iteration = iteration
        self.loss = loss
        self.bad = bad


def non_finite_gradient_message(bad: int, total: int, loss: float, iteration: int, data_problem: str | None) -> str:
    """The advice for a gradient with ``bad`` of ``total`` entries NaN/inf at a finite ``loss``: the data or the
    model made it (``data_problem``: what a check of the batch found, None when its values are finite)."""
    cause = (
        f"look at the data: {data_problem}"
        if data_problem
        else "look at the model or the loss (the batch's features and labels are finite): a log or a division of 0, "
        "a sqrt at 0, a pow or exp that overflows"
    )
    return (
        f"the gradient is not finite ({bad} of {total} entries NaN or inf) at iteration {iteration} while the loss "
        f"is finite ({loss:.4g}), so the learning rate is not the cause; {cause}. Fix the data (drop or repair the "
        "rows) or the model (torch.clamp before log/sqrt, an epsilon in divisions)"
    )


def check_gradient(
    params: Sequence[torch.nn.Parameter],
    loss: float,
    iteration: int,
    batches: Sequence[Any],
    clear_grads: Callable[[], None],
) -> None:
    """Raise `NonFiniteGradient` (after ``clear_grads()``) when a gradient entry of ``params`` is NaN or
    inf, before the updater steps. One max-abs pass over the gradients (it cannot overflow, and NaN propagates
    through it); the entries are counted, and ``batches`` checked for NaN/inf values, only when it fails."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or math.isfinite(float(torch.nn.utils.get_total_norm(grads, norm_type=math.inf))):
        return
    bad = sum(int((~torch.isfinite(g)).sum()) for g in grads)
    if bad == 0:
        return
    total = sum(g.numel() for g in grads)
    clear_grads()
    problem = None
    for batch in batches:
        try:
            batch.check_finite("training data")
        except DataError as e:
            problem = str(e)
            break
    raise NonFiniteGradient(non_finite_gradient_message(bad, total, loss, iteration, problem), iteration, loss, bad)


def update_divergence(update_norm: float, param_norm: float, loss: float, iteration: int, updater: Any) -> str | None:
    """The divergence message for an update of norm ``update_norm`` on parameters of norm ``param_norm`` (None when
    the update is a healthy one)."""
    if not math.isfinite(update_norm):
        return diverged_message(f"the update turned {update_norm} (loss {loss:.4g})", iteration, updater)
    ratio = update_norm / max(param_norm, 1.0)
    if ratio > MAX_UPDATE_RATIO:
        return diverged_message(
            f"the update exploded: its norm {update_norm:.3g} is {ratio:.3g}x the parameters' "
            f"norm {param_norm:.3g} (loss {loss:.4g})",
            iteration,
            updater,
        )
    return None


def check_on_divergence(owner: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` is one of `DIVERGENCE_ACTIONS`."""
    check_choice("on_divergence", value, DIVERGENCE_ACTIONS, owner=owner)
