"""The training algorithms a worker can run, as a registry from mode name to algorithm.

An algorithm has three steps around the epochs: ``start`` (per-fit state, e.g. gradient-sharing residuals),
``epoch`` (one pass over the worker's batches, talking to peers through the communicator) and ``finish`` (what
to hand back beyond params and updater state: e.g. residuals and threshold state).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Protocol

import torch

from torchspark.data import Batch
from torchspark.nn import Network
from torchspark.training.averaging import AveragingSettings, EpochOutcome, averaging_epoch
from torchspark.training.comm import Communicator
from torchspark.training.hooks import WorkerHooks
from torchspark.training.sharing import SharingAlgorithm

__all__ = ["Algorithm", "AveragingAlgorithm", "ALGORITHMS"]


class Algorithm(Protocol):
    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> "Algorithm": ...

    def start(self, net: Network, comm: Communicator) -> Any: ...

    def epoch(self, state: Any, net: Network, batches: Iterable[Batch], comm: Communicator, hooks: WorkerHooks,
              epoch: int) -> EpochOutcome: ...

    def finish(self, state: Any, net: Network, comm: Communicator) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        ...

    def rank_state(self, state: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """This rank's algorithm state for a checkpoint: tensors and a JSON-able record."""
        ...

    def restore(self, state: Any, net: Network, tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> None:
        """Inverse of :meth:`rank_state`, applied to the state :meth:`start` returned."""
        ...


@dataclass(frozen=True)
class AveragingAlgorithm:
    """Synchronous parameter averaging (:mod:`torchspark.training.averaging`)."""

    settings: AveragingSettings

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> "AveragingAlgorithm":
        names = AveragingSettings.__dataclass_fields__
        return cls(AveragingSettings(**{k: v for k, v in settings.items() if k in names}))

    def start(self, net: Network, comm: Communicator) -> None:
        return None

    def epoch(self, state: None, net: Network, batches: Iterable[Batch], comm: Communicator, hooks: WorkerHooks,
              epoch: int) -> EpochOutcome:
        return averaging_epoch(net, batches, comm, self.settings, hooks, epoch, validate_first=(epoch == 0))

    def finish(self, state: None, net: Network, comm: Communicator) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {}, {}

    def rank_state(self, state: None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {}, {}  # everything lives in the network (parameters, updater state, buffers)

    def restore(self, state: None, net: Network, tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self.settings)


ALGORITHMS: dict[str, Any] = {"averaging": AveragingAlgorithm, "sharing": SharingAlgorithm}
