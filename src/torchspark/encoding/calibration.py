"""Calibrating a threshold from the first update (the start of a ``initial="calibrated"`` policy): the threshold
at which updates like the first would be sent at the policy's target sparsity ([`calibrated_threshold`][torchspark.encoding.calibrated_threshold]), and
one value all workers agree on ([`agree_threshold`][torchspark.encoding.agree_threshold]).

Example::

    t = agree_threshold(all_gather(calibrated_threshold(first_update, policy.calibration_target())))
    state = policy.calibrated_state(t)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from torchspark.errors import ConfigError

__all__ = ["calibrated_threshold", "agree_threshold"]

# Calibration looks at a strided sample of at most this many entries: the threshold is a distribution statistic,
# and a bounded sample keeps the one-off cost at a few ms for any model size.
_CALIBRATION_SAMPLES = 1 << 20


_BISECTION_STEPS = 60


def calibrated_threshold(
    update: torch.Tensor, target_sparsity: float, *, max_samples: int = _CALIBRATION_SAMPLES
) -> float | None:
    """The threshold at which updates like ``update`` would be sent with sparsity ``target_sparsity``.

    Model: a residual entry that receives steps of size ``a`` with random signs grows like ``a * sqrt(k)`` after
    ``k`` steps, so it reaches ``t`` about every ``(t / a)**2`` steps, i.e. is sent with frequency
    ``min(1, (a / t)**2)``. The calibrated ``t`` solves ``mean_i min(1, (a_i / t)**2) = target_sparsity`` over the
    update's entries ``a_i = |update_i|``. Entries whose steps keep one sign are sent more often (``a / t``), entries
    that stop changing less; the threshold policy corrects the rest from the sparsity it then measures.

    Steps:
        1. ``a = |update|``, on a strided sample of at most ``max_samples`` entries (float64), non-finite dropped.
        2. No entry > 0: None (nothing to calibrate from). At most ``target_sparsity`` of the entries are > 0:
           the smallest positive ``a`` (every non-zero entry is sent, which is already sparse enough).
        3. Otherwise bisect ``log t`` between ``min(a > 0)`` (sparsity >= the fraction of non-zero entries, above
           the target) and ``max(a) / sqrt(target_sparsity)`` (sparsity <= target).

    Args:
        update: the first update (any shape; flattened), e.g. Adam's first step (all entries ~ lr).
        target_sparsity: fraction of entries to send per step, in (0, 1).
        max_samples: sample size bound (>= 1).

    Returns:
        The threshold (a float > 0), or None when the update is all zero or non-finite.

    Raises:
        ConfigError: ``target_sparsity`` not in (0, 1) or ``max_samples < 1``.
    """
    if not (isinstance(target_sparsity, (int, float)) and 0 < target_sparsity < 1):
        raise ConfigError(f"target_sparsity must be in (0, 1), got {target_sparsity!r}; try 1e-3")
    if not (isinstance(max_samples, int) and max_samples >= 1):
        raise ConfigError(f"max_samples must be an int >= 1, got {max_samples!r}")
    # 1. magnitudes of a strided sample
    flat = update.detach().reshape(-1)
    stride = max(1, -(-flat.numel() // max_samples))
    a = flat[::stride].to(torch.float64).abs()
    total = a.numel()
    a = a[torch.isfinite(a) & (a > 0)]
    # 2. degenerate cases
    if a.numel() == 0:
        return None
    lo, hi = float(a.min()), float(a.max()) / math.sqrt(target_sparsity)
    if a.numel() <= target_sparsity * total:
        return lo
    # 3. bisection on log t: sparsity(t) = mean(min(1, (a/t)^2)) decreases in t; keep sparsity(lo) > target >= ...(hi)
    a2 = a * a
    for _ in range(_BISECTION_STEPS):
        mid = math.sqrt(lo * hi)
        if float(torch.clamp(a2 / (mid * mid), max=1.0).sum()) / total > target_sparsity:
            lo = mid
        else:
            hi = mid
    return hi


def agree_threshold(thresholds: Sequence[float | None]) -> float | None:
    """One threshold from every worker's calibrated value: the geometric mean of those that are finite and > 0.

    Computed from the gathered values in rank order, so every worker gets the same number. None when no worker had
    a value (no worker had data or a non-zero update yet).
    """
    values = [t for t in thresholds if t is not None and math.isfinite(t) and t > 0]
    if not values:
        return None
    return math.exp(sum(math.log(t) for t in values) / len(values))
