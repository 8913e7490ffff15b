"""User-defined modules for the "bring your own model" tests: plain ``torch.nn.Module`` subclasses, as a user
writes them, importable by path (``own_models:MLP``) the way ``helpers`` is (pytest puts ``tests/`` on
``sys.path``). Spark executors import them only where ``tests/`` is on their ``PYTHONPATH``: a Spark test ships
this module by value instead (``cloudpickle.register_pickle_by_value``).
"""

from __future__ import annotations

import torch
from torch import nn

import torchspark


class MLP(nn.Module):
    """A two-layer perceptron whose constructor needs its sizes (not recorded: loads with ``module=``)."""

    def __init__(self, n_in: int, hidden: int, n_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@torchspark.nn.capture
class CapturedMLP(MLP):
    """``MLP`` whose constructor arguments are recorded, so a saved network rebuilds it from the file."""

    def __init__(self, n_in: int, hidden: int = 16, n_out: int = 3, *, dropout: float = 0.0) -> None:
        super().__init__(n_in, hidden, n_out)
        self.dropout = nn.Dropout(dropout)


class DefaultMLP(MLP):
    """An ``MLP`` whose constructor needs no arguments (rebuilt with its defaults)."""

    def __init__(self, n_in: int = 4, hidden: int = 8, n_out: int = 3) -> None:
        super().__init__(n_in, hidden, n_out)


@torchspark.nn.capture
class WithLayer(nn.Module):
    """A captured module built with another module as an argument (no JSON form: not recorded)."""

    def __init__(self, n_in: int, act: nn.Module) -> None:
        super().__init__()
        self.fc = nn.Linear(n_in, 3)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(x))


def mlp_factory(n_in: int = 4, hidden: int = 8, n_out: int = 3) -> nn.Module:
    """A factory function returning a plain module: what ``TorchEstimator(network="own_models:mlp_factory")`` and
    ``torchspark train --model own_models:mlp_factory`` call."""
    return DefaultMLP(n_in, hidden, n_out)


@torchspark.nn.capture
class DigitsNet(nn.Module):
    """A classifier of the built-in digits ((1, 8, 8) images, 10 classes): what ``torchspark train --model
    own_models:DigitsNet --trust-code`` trains."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))
