"""What the training stats are made of: phase names, single events and the columnar tables that hold many.

A *phase event* is one timed interval on one worker: ``(worker, phase, start, duration, attrs)``. Starts are wall-clock
seconds (epoch time) on the **driver's** clock (worker clocks are shifted by their measured offset, see
`torchspark.stats.clock`). Millions of events are held column-wise (numpy arrays plus a name table) so that a
payload from a worker stays compact and the driver can aggregate them quickly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

__all__ = [
    "Phase",
    "STANDARD_PHASES",
    "DRIVER_ID",
    "PAYLOAD_FORMAT",
    "phase_name",
    "PhaseEvent",
    "EventTable",
    "ScoreTable",
    "EncodingTable",
]

#: Worker id used for events recorded by the training master itself; it is not counted in ``summary()["workers"]``.
DRIVER_ID = "driver"

#: Version tag carried by every worker payload and JSON document.
PAYLOAD_FORMAT = "torchspark.stats/1"


class Phase(str, Enum):
    """Standard phase names. Any other string is allowed as a phase name too."""

    EXPORT = "export"  # master: writing the training data as batch files
    COUNT = "count"  # master: counting the RDD
    REPARTITION = "repartition"  # master: balancing partitions over workers
    BROADCAST = "broadcast"  # master: broadcasting parameters / network config
    NETWORK_INIT = "network_init"  # worker: building the network from the broadcast
    DATA_WAIT = "data_wait"  # worker: waiting for the next minibatch (input pipeline too slow if large)
    FIT = "fit"  # worker: forward + backward + update of one minibatch
    AVERAGING = "averaging"  # parameter averaging round
    EXCHANGE = "exchange"  # gradient sharing: sending / receiving encoded updates
    AGGREGATION = "aggregation"  # master: combining worker results
    EVALUATION = "evaluation"  # distributed evaluation


#: The standard phase names as plain strings, in pipeline order (the report lists phases in this order).
STANDARD_PHASES: tuple[str, ...] = tuple(p.value for p in Phase)


def phase_name(name: str | Phase) -> str:
    """The plain string name of a phase (a [`Phase`][torchspark.stats.Phase] member or any string)."""
    return name.value if isinstance(name, Phase) else str(name)


@dataclass(frozen=True)
class PhaseEvent:
    """One timed phase on one worker.

    Attributes:
        worker: worker id, e.g. ``"driver"`` or ``"worker-0"``.
        phase: phase name (see [`Phase`][torchspark.stats.Phase]).
        start: start time, seconds since the epoch on the driver's clock.
        duration: seconds.
        attrs: numeric attributes, e.g. ``{"examples": 32.0, "iteration": 7.0}``.
    """

    worker: str
    phase: str
    start: float
    duration: float
    attrs: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EventTable:
    """Many phase events, column-wise.

    Attributes:
        worker_names: worker id for each code in ``worker``.
        phase_names: phase name for each code in ``phase``.
        worker: int32 codes into ``worker_names``, shape (n,).
        phase: int32 codes into ``phase_names``, shape (n,).
        start: float64 driver-clock start times, shape (n,).
        duration: float64 seconds, shape (n,).
        attrs: attribute name -> float64 array of shape (n,), NaN where an event lacks the attribute.
    """

    worker_names: tuple[str, ...]
    phase_names: tuple[str, ...]
    worker: np.ndarray
    phase: np.ndarray
    start: np.ndarray
    duration: np.ndarray
    attrs: dict[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.start.shape[0])

    def events(self) -> list[PhaseEvent]:
        """The rows as [`PhaseEvent`][torchspark.stats.PhaseEvent] objects (for inspection and tests; slow for millions of events)."""
        out = []
        for i in range(len(self)):
            attrs = {k: float(v[i]) for k, v in self.attrs.items() if not np.isnan(v[i])}
            out.append(
                PhaseEvent(
                    self.worker_names[self.worker[i]],
                    self.phase_names[self.phase[i]],
                    float(self.start[i]),
                    float(self.duration[i]),
                    attrs,
                )
            )
        return out


@dataclass(frozen=True)
class ScoreTable:
    """Score (loss) vs iteration, for all workers, column-wise: ``worker`` codes, ``iteration``, ``score``."""

    worker_names: tuple[str, ...]
    worker: np.ndarray  # int32 (n,)
    iteration: np.ndarray  # int64 (n,)
    score: np.ndarray  # float64 (n,)

    def __len__(self) -> int:
        return int(self.score.shape[0])


@dataclass(frozen=True)
class EncodingTable:
    """Per-step gradient-encoding stats for all workers, column-wise.

    ``bytes_sent`` is the wire size of the message, ``dense_bytes`` the size the dense float32 update would have had,
    ``sparsity`` the fraction of entries sent, ``threshold`` the step size, ``format`` codes into ``format_names``.
    """

    worker_names: tuple[str, ...]
    format_names: tuple[str, ...]
    worker: np.ndarray  # int32 (n,)
    step: np.ndarray  # int64 (n,)
    bytes_sent: np.ndarray  # int64 (n,)
    dense_bytes: np.ndarray  # int64 (n,)
    sparsity: np.ndarray  # float64 (n,)
    threshold: np.ndarray  # float64 (n,)
    format: np.ndarray  # int32 (n,)

    def __len__(self) -> int:
        return int(self.step.shape[0])
