"""The workers' data as ``ParallelWrapper`` routes it, and how it reaches the worker processes.

A list of minibatches is serialized once and sent with the worker's start arguments, then replayed every epoch
(like Spark's direct route); batch-file paths are read by the workers; per-epoch plans and a one-shot iterable
stream through one bounded queue per worker, fed by threads of the parent (`start_feeders`), each epoch closed
by `EPOCH_END`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torchspark.data import DataSet, MultiDataSet, dataset_to_bytes
from torchspark.errors import DataError
from torchspark.training.assignment import EpochItems
from torchspark.training.task import EpochSource
from torchspark.training.waiting import get_within, put_until_stopped
from torchspark.training.worker.loop import ItemSource

__all__ = ["EPOCH_END", "QueueSource", "WorkerShares", "Put", "put_item", "initial_items", "wire", "start_feeders"]

EPOCH_END = "__torchspark_epoch_end__"
#: how often a feeder blocked on a full queue checks the stop flag
_POLL_S = 0.2

#: how a feeder puts one item into a worker's queue: ``put(queue, item, stop) -> False`` once ``stop`` is set
Put = Callable[[Any, Any, threading.Event], bool]


def put_item(q: Any, item: Any, stop: threading.Event) -> bool:
    """The feeders' `Put`: wait for room in the bounded queue, give up (False) once ``stop`` is set."""
    return put_until_stopped(q, item, stop, _POLL_S)


class QueueSource:
    """A worker's data fed by the parent through a queue; ``EPOCH_END`` closes each epoch."""

    #: every wait is bounded by ``data_timeout_s`` here, so the worker needs no loader thread to bound it
    bounded_wait = True

    def __init__(self, q: Any, timeout_s: float) -> None:
        self._q = q
        self._timeout_s = timeout_s

    def epoch(self, index: int) -> Iterable[Any]:
        while True:
            item = get_within(
                self._q,
                self._timeout_s,
                lambda: f"no minibatch arrived from the parent within data_timeout_s={self._timeout_s}",
            )
            if isinstance(item, str) and item == EPOCH_END:
                return
            yield item


@dataclass
class WorkerShares:
    """The workers' data as ``ParallelWrapper`` routes it: exactly one of ``feeds`` / ``epoch_feeds`` / ``paths`` /
    ``stream``.

    Args:
        workers: how many workers share it.
        feeds: per-worker lists of minibatches, sent once to each worker (serialized) and replayed every epoch.
        epoch_feeds: ``epoch_feeds[e][w]``: worker ``w``'s minibatches in epoch ``e`` of the fit (a new seeded
            plan every epoch), sent through each worker's queue epoch by epoch. ``first_epoch`` numbers them.
        paths: per-worker lists of batch-file paths, read by the workers themselves.
        stream: a one-shot iterable of minibatches dealt round-robin (one epoch only).
    """

    workers: int
    feeds: Sequence[Sequence[Any]] | None = None
    paths: Sequence[Sequence[str]] | None = None
    stream: Iterable[Any] | None = None
    epoch_feeds: Sequence[Sequence[Sequence[Any]]] | None = None
    first_epoch: int = 0

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.feeds, self.paths, self.stream, self.epoch_feeds)) != 1:
            raise ValueError("pass exactly one of feeds, epoch_feeds, paths or stream")

    @property
    def queued(self) -> bool:
        """Whether the workers get their data through queues (a stream or per-epoch plans)."""
        return self.stream is not None or self.epoch_feeds is not None

    def local_sources(self) -> list[EpochSource]:
        """Per-worker sources readable in this process (a stream is dealt round-robin here, as the feeder does)."""
        if self.stream is not None:
            dealt: list[list[Any]] = [[] for _ in range(self.workers)]
            for i, item in enumerate(self.stream):
                dealt[i % self.workers].append(item)
            return [ItemSource(items) for items in dealt]
        if self.epoch_feeds is not None:
            return [
                ItemSource(
                    [EpochItems(self.first_epoch + e, tuple(plan[w])) for e, plan in enumerate(self.epoch_feeds)]
                )
                for w in range(self.workers)
            ]
        shares = self.feeds if self.feeds is not None else self.paths
        assert shares is not None
        return [ItemSource(list(share)) for share in shares]


def initial_items(shares: WorkerShares, rank: int) -> list[str | bytes] | None:
    """What worker ``rank`` receives at start: its paths, or its minibatches serialized once (None: it is fed
    through its queue)."""
    if shares.paths is not None:
        return list(shares.paths[rank])
    if shares.feeds is not None:
        return [wire(b) for b in shares.feeds[rank]]
    return None


def wire(item: Any) -> Any:
    """Minibatches cross the process boundary as batch bytes (no shared-memory file descriptors to leak)."""
    if isinstance(item, (DataSet, MultiDataSet)):
        return dataset_to_bytes(item)
    if isinstance(item, (bytes, str)):
        return item
    raise DataError(f"cannot send a {type(item).__name__} to a worker; expected a DataSet or MultiDataSet")


def start_feeders(
    shares: WorkerShares, queues: Sequence[Any], stop: threading.Event, errors: list[BaseException], put: Put = put_item
) -> list[threading.Thread]:
    """Start the threads that feed the workers' queues (none when every worker got its share at start).

    A stream is dealt round-robin by one thread; per-epoch plans get one thread per worker (a full queue must never
    starve a peer). Every item goes in through ``put``; a feeder gives up once ``stop`` is set, and appends what it
    raised to ``errors`` (the supervisor raises it on the calling thread).
    """
    if shares.stream is not None:
        feeders = [
            threading.Thread(
                target=_feed_stream,
                args=(queues, shares.stream, stop, errors, put),
                name="torchspark-feeder",
                daemon=True,
            )
        ]
    elif shares.epoch_feeds is not None:
        feeders = [
            threading.Thread(
                target=_feed_epochs,
                args=(queues[w], [plan[w] for plan in shares.epoch_feeds], stop, errors, put),
                name=f"torchspark-feeder-{w}",
                daemon=True,
            )
            for w in range(len(queues))
        ]
    else:
        feeders = []
    for feeder in feeders:
        feeder.start()
    return feeders


def _feed_stream(
    queues: Sequence[Any], stream: Iterable[Any], stop: threading.Event, errors: list[BaseException], put: Put
) -> None:
    """Deal a one-shot stream of minibatches round-robin, then close the (only) epoch on every queue."""
    n = len(queues)
    try:
        for i, item in enumerate(stream):
            if not put(queues[i % n], wire(item), stop):
                return
        for q in queues:
            if not put(q, EPOCH_END, stop):
                return
    except BaseException as e:  # noqa: BLE001 - surfaced by the supervisor on the calling thread
        errors.append(e)


def _feed_epochs(
    q: Any, epochs: Sequence[Sequence[Any]], stop: threading.Event, errors: list[BaseException], put: Put
) -> None:
    """Send one worker its minibatches epoch by epoch, closing each epoch."""
    try:
        for items in epochs:
            for item in items:
                if not put(q, wire(item), stop):
                    return
            if not put(q, EPOCH_END, stop):
                return
    except BaseException as e:  # noqa: BLE001 - surfaced by the supervisor on the calling thread
        errors.append(e)
