"""When training has diverged, and the one message every route gives for it.

Parameter averaging notices divergence when a worker's loss turns NaN or infinite (the network refuses to step on
it). Gradient sharing can diverge without ever seeing a NaN loss: threshold encoding sends at most ``±threshold``
per parameter and step, so a huge learning rate blows the parameters up by a large but finite amount, the loss
stays finite and the fit ends at chance accuracy. So the sharing loop also checks every update it encodes
(`update_divergence`): an update that is not finite, or whose norm exceeds `MAX_UPDATE_RATIO` times
the parameters' norm (at least 1), is divergence. Healthy training moves the parameters by ~1e-3 of their norm
per step; a step a thousand times larger than the parameters themselves is never learning.

What happens then is ``on_divergence`` (`DIVERGENCE_ACTIONS`): ``"fail"`` (default) raises
[`TrainingError`][torchspark.errors.TrainingError] with `diverged_message`; ``"warn"`` logs it once per worker and
fit, the fit goes on, and the driver warns with the same text after the fit.
"""

from __future__ import annotations

import math
from typing import Any

from torchspark.validation import check_choice

__all__ = ["DIVERGENCE_ACTIONS", "MAX_UPDATE_RATIO", "diverged_message", "update_divergence", "check_on_divergence"]

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
