"""A module whose gradient turns NaN on marked rows while its loss stays finite: the way a log of 0 or a sqrt at 0
in a model's backward poisons one step. Importable from every test folder as :mod:`helpers` is (``tests/`` is on
``sys.path``), and by name in spawned workers."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: a row whose first feature holds exactly this value gets a NaN gradient (its forward is untouched)
MARKER = 99.0


class _NaNBackward(torch.autograd.Function):
    """Identity forward; the backward gives NaN for the rows of ``poisoned``."""

    @staticmethod
    def forward(ctx: Any, outputs: torch.Tensor, poisoned: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(poisoned)
        return outputs.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (poisoned,) = ctx.saved_tensors
        return torch.where(poisoned.unsqueeze(1), torch.full_like(grad, float("nan")), grad), None


class NaNGradientMLP(nn.Module):
    """A two-layer MLP; rows whose first feature is :data:`MARKER` give a NaN gradient with a finite loss."""

    def __init__(self, n_in: int, hidden: int, n_out: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(x.reshape(x.shape[0], -1))
        if not self.training:
            return out
        return _NaNBackward.apply(out, x.reshape(x.shape[0], -1)[:, 0] == MARKER)
