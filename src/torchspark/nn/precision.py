"""Mixed precision for a [`Network`][torchspark.Network]: the autocast dtype of the forward pass and, for fp16,
the gradient scaler (torch's AMP recipe).

The master weights, their gradients and the updater stay float32 whatever the precision; only the module's forward
pass runs under ``torch.autocast`` (matrix products and convolutions in bf16/fp16, reductions and losses in
float32), and its outputs come back as float32. So everything downstream (losses, evaluation, the flat parameter
views, gradient sharing's update and residual) sees float32.

fp16's narrow range (largest value 65504, smallest normal 6e-5) makes small gradients underflow, so fp16 scales
the loss before ``backward`` (`torch.amp.GradScaler`) and one step is::

    1. backward(loss * scale)            gradients are scale x too large, so they survive fp16
    2. unscale: grads /= scale           before gradient_clip and l1 see them
    3. the updater's step, unless a gradient is inf/NaN (then the step is skipped: parameters and updater state
       stay as they were)
    4. update the scale: halve it after a skipped step, double it after ``growth_interval`` good steps

A skipped step is not divergence: it is how the scaler finds a scale that fits. The network's ``iteration`` still
advances (it counts the minibatches trained, which every worker of a distributed fit must agree on); the number of
skipped steps is [`Precision.skipped_steps`][torchspark.nn.Precision.skipped_steps]. The scaler's state (scale, growth tracker) is saved with the
updater and in checkpoints ([`Precision.state_tensors`][torchspark.nn.Precision.state_tensors]).

Example::

    amp = Precision("bf16", torch.device("cpu"))
    with amp.autocast():
        logits = module(x)            # bf16 activations
    outputs = amp.to_float32([logits])
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager

import torch

from torchspark.errors import ConfigError
from torchspark.validation import check_choice

__all__ = ["PRECISIONS", "SCALER_KEYS", "Precision"]

#: precision name -> the autocast dtype (None: plain float32, no autocast)
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

#: the tensors of fp16's scaler state, as saved beside the updater state and in checkpoints
SCALER_KEYS = ("grad_scaler.scale", "grad_scaler.growth_tracker")


class Precision:
    """The autocast dtype of one network's forward pass and, for ``"fp16"``, its gradient scaler.

    Args:
        name: ``"fp32"`` (no autocast), ``"bf16"`` or ``"fp16"`` (see [`Network`][torchspark.Network]'s
            ``precision``).
        device: the network's device; autocast and the scaler run for its device type.
    Raises:
        ConfigError: an unknown name, or a device type where torch has no autocast for it (the message names the
            fix).
    """

    def __init__(self, name: str, device: torch.device) -> None:
        check_choice("precision", name, PRECISIONS, fix="'bf16' on CPUs and recent GPUs, 'fp16' on older GPUs")
        self.name = name
        self.dtype = PRECISIONS[name]
        self.device_type = device.type
        if self.dtype is not None and not torch.amp.is_autocast_available(device.type):
            raise ConfigError(
                f"precision={name!r}: torch has no autocast for device type {device.type!r}; use precision='fp32' there"
            )
        if (
            self.dtype is torch.bfloat16
            and device.type == "cuda"
            and torch.cuda.is_available()
            and not torch.cuda.is_bf16_supported()
        ):
            raise ConfigError(f"precision='bf16': the GPU {device} has no bfloat16 support; use precision='fp16'")
        #: fp16's loss scaler (None for fp32 and bf16, whose range is float32's)
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
        #: steps fp16's scaler skipped since this object was made (inf/NaN gradients at the current scale)
        self.skipped_steps = 0

    def autocast(self) -> AbstractContextManager[None]:
        """The context the forward pass runs in: ``torch.autocast`` at this dtype (a no-op for fp32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def to_float32(self, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The module's outputs with every bf16/fp16 tensor cast to float32 (unchanged for fp32)."""
        if self.dtype is None:
            return outputs
        return [
            o.float() if isinstance(o, torch.Tensor) and o.dtype in (torch.bfloat16, torch.float16) else o
            for o in outputs
        ]

    def backward(self, loss: torch.Tensor) -> None:
        """Step 1: ``loss.backward()``, of the scaled loss for fp16; gradients accumulate into ``.grad``."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Step 2: divide the gradients by the scale (fp16), so clipping and l1 see the true gradients."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Steps 3-4: the updater's step (skipped by fp16's scaler when a gradient is inf/NaN) and the scale's
        update. Returns whether the step was taken."""
        if self.scaler is None:
            optimizer.step()
            return True
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # the scale only shrinks (by backoff_factor < 1) after a step it skipped
        taken = self.scaler.get_scale() >= scale
        self.skipped_steps += 0 if taken else 1
        return taken

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """fp16's scaler state as CPU tensors (`SCALER_KEYS`); empty for fp32 and bf16."""
        if self.scaler is None:
            return {}
        state = self.scaler.state_dict()
        return {
            SCALER_KEYS[0]: torch.tensor([state["scale"]], dtype=torch.float32),
            SCALER_KEYS[1]: torch.tensor([state["_growth_tracker"]], dtype=torch.int64),
        }

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore [`state_tensors`][torchspark.nn.Precision.state_tensors] output (other keys of ``tensors`` are ignored; without the scaler's keys,
        or without a scaler, nothing changes)."""
        if self.scaler is None or not all(k in tensors for k in SCALER_KEYS):
            return
        state = self.scaler.state_dict()
        state["scale"] = float(tensors[SCALER_KEYS[0]].reshape(-1)[0])
        state["_growth_tracker"] = int(tensors[SCALER_KEYS[1]].reshape(-1)[0])
        self.scaler.load_state_dict(state)

    def __repr__(self) -> str:
        return f"Precision({self.name!r}, device_type={self.device_type!r})"
