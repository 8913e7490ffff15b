"""A module whose forward waits, inside a worker process, until a gate file exists (module level, so workers can
import it by name). It holds workers still at a point the test chooses, without sleeping for a guessed time."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

#: how long a worker waits for the gate before failing the fit (a broken test, not a slow machine)
GATE_TIMEOUT_S = 120.0


class GatedLinear(nn.Module):
    """A linear classifier whose forward blocks in any process but the one that built it until ``gate`` exists."""

    def __init__(self, n_in: int, n_out: int, gate: str) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)
        self.gate = gate
        self.owner_pid = os.getpid()  # the test process: its own checks (the wrapper's sample check) never wait

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.getpid() != self.owner_pid:
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while not os.path.exists(self.gate):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gate {self.gate} was not opened within {GATE_TIMEOUT_S} s")
                time.sleep(0.01)
        return self.linear(x)
