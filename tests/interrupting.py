"""A model that interrupts a fit on demand inside the workers (module level, so worker processes and Spark
executors can rebuild it; tests register it for pickling by value).

The interrupted fit and the resumed one differ only in ``after``: the state dict is the same, so the resumed fit
loads the interrupted one's checkpoint.
"""

from __future__ import annotations

import os

import torch
from torch import nn


class Interrupted(Exception):
    """The fault: a worker stops mid-fit (what a lost executor or a killed process looks like to the fit)."""


class InterruptingMLP(nn.Module):
    """A two-layer MLP whose training forward raises in a worker after ``after`` calls (None: never).

    Only processes other than the one that built it count (the driver's own sample checks never raise), and each
    worker builds its own copy from the broadcast, so ``after`` counts that worker's minibatches. With
    ``owner_pid=None`` (threads of one process, the in-process runner) every copy counts.
    """

    def __init__(
        self,
        n_in: int,
        hidden: int,
        n_out: int,
        after: int | None = None,
        seed: int = 0,
        same_process: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        torch.manual_seed(seed)
        layers = [nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, n_out)]
        if dropout:  # after the last layer, so the state dict's names stay those without dropout
            layers.append(nn.Dropout(dropout))
        self.net = nn.Sequential(*layers)
        self.after = after
        self.calls = 0
        self.owner_pid = None if same_process else os.getpid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.after is not None and os.getpid() != self.owner_pid:
            self.calls += 1
            if self.calls > self.after:
                raise Interrupted(f"worker stopped after {self.after} minibatches")
        return self.net(x)
