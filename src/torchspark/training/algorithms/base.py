"""What every training algorithm implements: the `Algorithm` protocol and the `EpochOutcome` an epoch
returns.

An algorithm has three steps around the epochs: ``start`` (per-fit state, e.g. gradient-sharing residuals),
``epoch`` (one pass over the worker's batches, talking to peers through the communicator) and ``finish`` (what to
hand back beyond params and updater state: e.g. residuals and threshold state).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from torchspark.data import Trainable
from torchspark.nn import Network
from torchspark.training.comm import Communicator
from torchspark.training.hooks import WorkerHooks

__all__ = ["Algorithm", "EpochOutcome"]


class Algorithm(Protocol):
    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Algorithm: ...

    def start(self, net: Network, comm: Communicator) -> Any: ...

    def epoch(
        self, state: Any, net: Network, batches: Iterable[Trainable], comm: Communicator, hooks: WorkerHooks, epoch: int
    ) -> EpochOutcome: ...

    def finish(
        self, state: Any, net: Network, comm: Communicator
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]: ...

    def rank_state(self, state: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """This rank's algorithm state for a checkpoint: tensors and a JSON-able record."""
        ...

    def restore(self, state: Any, net: Network, tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> None:
        """Inverse of `rank_state`, applied to the state `start` returned."""
        ...


@dataclass
class EpochOutcome:
    """What one worker did in one epoch."""

    examples: int = 0
    iterations: int = 0
    rounds: int = 0
    #: this worker's own loss on its last minibatch of the epoch (NaN if it had none)
    last_score: float = float("nan")
    #: sum over this worker's minibatches of ``loss * examples`` (for an epoch's mean score)
    score_sum: float = 0.0
