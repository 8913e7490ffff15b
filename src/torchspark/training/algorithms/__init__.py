"""The training algorithms a worker can run (what one epoch of a worker does), as a registry from mode name to
algorithm.

* `averaging`: synchronous parameter averaging;
* `sharing`: threshold-encoded gradient sharing (Strom 2015), synchronous
  (``"sharing"``, all-gather or sharded exchange) or with bounded staleness (``"stale_sharing"``).

Every algorithm implements `Algorithm`; a new one is a module here and
a line in [`ALGORITHMS`][torchspark.training.ALGORITHMS].
"""

from __future__ import annotations

from typing import Any

from torchspark.training.algorithms.averaging import AveragingAlgorithm
from torchspark.training.algorithms.base import Algorithm, EpochOutcome
from torchspark.training.algorithms.sharing.loop import SharingAlgorithm
from torchspark.training.algorithms.sharing.stale import StaleSharingAlgorithm

__all__ = ["Algorithm", "AveragingAlgorithm", "EpochOutcome", "ALGORITHMS"]


ALGORITHMS: dict[str, Any] = {
    "averaging": AveragingAlgorithm,
    "sharing": SharingAlgorithm,
    "stale_sharing": StaleSharingAlgorithm,
}
