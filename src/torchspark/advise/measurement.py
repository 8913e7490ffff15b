"""Measure one worker: milliseconds per iteration, parameter and updater-state bytes, encoded message size.

[`measure`][torchspark.advise.measure] trains a copy of the network on one minibatch shape, on this process, as one worker would:

  1. ``warmup`` plain iterations (first-call costs: allocation, kernel selection) are not timed;
  2. ``iterations`` timed ``train_step`` calls give the median seconds per iteration;
  3. ``iterations`` gradient-sharing steps at the steady-state ``sparsity``: ``compute_update``, then our codec
     ([`threshold_encode`][torchspark.encoding.threshold_encode], the wire format, decode) at the threshold that sends that
     fraction of the update's entries; they give the mean message size (the codec picks sparse or bitmap by size)
     and the encode + decode time. A real fit starts quieter: the residual first has to grow to the threshold, so
     its first messages are smaller; the default ``AdaptiveThreshold`` then holds the sparsity inside
     ``[1e-4, 1e-2]`` around ``1e-3``.
The driver's network is never changed: the measurement trains a copy.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from torchspark.advise.cost_model import Workload
from torchspark.encoding import decode, threshold_encode, to_bytes
from torchspark.errors import ConfigError
from torchspark.nn import NetworkBlueprint

__all__ = ["Measurement", "measure"]


@dataclass(frozen=True)
class Measurement:
    """What [`measure`][torchspark.advise.measure] found; [`workload`][torchspark.advise.Measurement.workload] feeds [`torchspark.advise.advise`][torchspark.advise.advise]."""

    batch_size: int
    iterations: int
    warmup: int
    num_params: int
    param_bytes: int
    updater_state_bytes: int
    ms_per_iteration: float
    shared_bytes_per_step: float
    encode_ms: float
    threads: int
    sparsity: float

    def workload(self) -> Workload:
        return Workload(
            seconds_per_iteration=self.ms_per_iteration / 1e3,
            param_bytes=self.param_bytes,
            updater_state_bytes=self.updater_state_bytes,
            shared_bytes_per_step=self.shared_bytes_per_step,
            encode_seconds=self.encode_ms / 1e3,
        )


def measure(network: Any, batch: Any, iterations: int = 20, warmup: int = 3, sparsity: float = 1e-3) -> Measurement:
    """Steps 1-3 of the module docstring on a copy of ``network``.

    Args:
        network: a [`Network`][torchspark.Network] (not modified).
        batch: one minibatch (``DataSet``) of the size a worker would train.
        iterations: timed iterations (the median is robust to a few slow ones); 20 is enough for >= 1 ms steps.
        warmup: untimed iterations first.
        sparsity: fraction of the entries a sharing message carries in steady state (the default
            ``AdaptiveThreshold`` aims at 1e-3).
    Raises:
        ConfigError: ``iterations`` < 1, ``warmup`` < 0 or ``sparsity`` not in (0, 1].
    """
    if not isinstance(sparsity, (int, float)) or not 0 < sparsity <= 1:
        raise ConfigError(f"sparsity must be in (0, 1], got {sparsity!r}; 1e-3 is the default policy's aim")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ConfigError(f"iterations must be an integer >= 1, got {iterations!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup must be an integer >= 0, got {warmup!r}")
    net = NetworkBlueprint.of(network).build()  # a worker's copy (a deepcopy would not keep the flat view)
    # 1. warm up
    for i in range(warmup):
        net.train_step(batch, validate=i == 0)
    # 2. plain iterations
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        net.train_step(batch)
        times.append(time.perf_counter() - start)
    # 3. sharing steps at the steady-state sparsity: message size, encode + decode time
    n = net.num_params()
    keep = max(1, round(sparsity * n))
    sizes, encode_times = [], []
    out = torch.zeros(n)
    for _ in range(iterations):
        update = net.compute_update(batch)  # (n,)
        threshold = float(update.abs().kthvalue(n - keep + 1).values) if keep < n else float(update.abs().min())
        start = time.perf_counter()
        message = threshold_encode(update, torch.zeros(n), max(threshold, 1e-30))
        payload = to_bytes(message) if message.format != "empty" else b""
        decode(message, out.zero_())
        encode_times.append(time.perf_counter() - start)
        net.apply_update(out)
        sizes.append(1 + len(payload))  # the exchange adds one flag byte
    return Measurement(
        batch_size=len(batch),
        iterations=iterations,
        warmup=warmup,
        num_params=net.num_params(),
        param_bytes=4 * net.num_params(),
        updater_state_bytes=4 * net.updater_state_size(),
        ms_per_iteration=statistics.median(times) * 1e3,
        shared_bytes_per_step=statistics.fmean(sizes),
        encode_ms=statistics.median(encode_times) * 1e3,
        threads=torch.get_num_threads(),
        sparsity=float(sparsity),
    )
