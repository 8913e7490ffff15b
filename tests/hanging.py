"""A model whose workers stop mid-fit until a marker file exists (module level, so executors can rebuild it;
tests register it for pickling by value): a worker that is alive but makes no progress, for fault tests that must
hit a running worker whatever the progress channel's delay."""

from __future__ import annotations

import os
import time

import torch
from torch import nn


class HangingMLP(nn.Module):
    """A two-layer MLP whose training forward, in a worker process, waits after ``after`` calls until ``marker``
    exists (at most ``limit_s`` seconds, then it goes on). The driver's own sample checks never wait."""

    def __init__(self, n_in: int, hidden: int, n_out: int, marker: str, after: int, limit_s: float = 120.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, n_out))
        self.marker, self.after, self.limit_s = marker, after, limit_s
        self.calls = 0
        self.owner_pid = os.getpid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and os.getpid() != self.owner_pid:
            self.calls += 1
            deadline = time.monotonic() + self.limit_s
            while self.calls > self.after and not os.path.exists(self.marker) and time.monotonic() < deadline:
                time.sleep(0.05)
        return self.net(x)
