"""A module that makes one worker process a straggler (module level, so workers can import it by name): its
forward sleeps on the worker whose torch.distributed rank is ``slow_rank``, and nowhere else."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn


class SlowOnRank(nn.Module):
    """``inner``, but every forward on rank ``slow_rank`` of the workers' process group first sleeps ``delay_s``."""

    def __init__(self, inner: nn.Module, slow_rank: int, delay_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.slow_rank = slow_rank
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and dist.is_initialized() and dist.get_rank() == self.slow_rank:
            time.sleep(self.delay_s)
        return self.inner(x)
