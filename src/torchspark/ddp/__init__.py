"""Threshold gradient sharing for your own training loop: a DDP communication hook
([`threshold_hook`][torchspark.ddp.threshold_hook] with its [`ThresholdHookState`][torchspark.ddp.ThresholdHookState],
the shape of PyTorch's PowerSGD hook) and [`ThresholdGradients`][torchspark.ddp.ThresholdGradients] for loops
without DDP. Guide: docs/guides/ddp-hook.md.

Example::

    from torchspark.ddp import ThresholdHookState, threshold_hook

    ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    state = ThresholdHookState(model)
    ddp_model.register_comm_hook(state, threshold_hook)
"""

from __future__ import annotations

from torchspark.ddp.hook import ThresholdGradients, ThresholdHookState, check_same_shapes, threshold_hook

__all__ = ["ThresholdHookState", "threshold_hook", "ThresholdGradients", "check_same_shapes"]
