"""A module that fails on demand inside a worker (module level, so spawned workers can import it by name)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn


class InjectedFailure(Exception):
    """The user's own error (not one torchspark knows or re-wraps)."""


class FailingForward(nn.Module):
    """A linear classifier whose training forward raises on worker ``rank`` after ``after`` calls.

    Only one worker fails, so the others see a peer's dropped connection: the driver must still report this
    module's error, not theirs.
    """

    def __init__(self, n_in: int, n_out: int, after: int, rank: int = 0) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)
        self.after = after
        self.rank = rank
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and dist.is_initialized() and dist.get_rank() == self.rank:
            self.calls += 1
            if self.calls > self.after:
                raise InjectedFailure(f"injected failure in forward call {self.calls}")
        return self.linear(x)


class HangingForward(nn.Module):
    """A linear classifier whose training forward hangs (sleeps ``hang_s``) on worker ``rank`` after ``after`` calls,
    in every attempt: a deterministic hang at one step, which the peers see as a wait that runs out."""

    def __init__(self, n_in: int, n_out: int, after: int, rank: int = 1, hang_s: float = 15.0) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)
        self.after, self.rank, self.hang_s = after, rank, hang_s
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and dist.is_initialized() and dist.get_rank() == self.rank:
            self.calls += 1
            if self.calls > self.after:
                time.sleep(self.hang_s)
        return self.linear(x)
