"""The worker loop: one function every runner calls (Spark barrier task, local process, thread).

``run_worker`` builds the network once per fit from the broadcast blueprint, pins torch's thread count, then
runs the master's algorithm for every epoch over the worker's data and returns a
[`WorkerResult`][torchspark.training.WorkerResult].
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from torchspark.data import Batch, DataSet, MultiDataSet, dataset_from_bytes, group_batches, load_batch
from torchspark.errors import DataError
from torchspark.nn import Network, NetworkBlueprint
from torchspark.training.algorithms import ALGORITHMS
from torchspark.training.assignment import EpochItems, FileSlices, epoch_seed
from torchspark.training.checkpoint import CheckpointWriter, RankProgress, restore_rank
from torchspark.training.checkpoint.position import Position, PositionTap
from torchspark.training.comm import Communicator
from torchspark.training.hooks import WorkerHooks
from torchspark.training.task import EpochSource, WorkerResult, WorkerTask, param_checksum
from torchspark.training.worker.devices import pins_memory, task_thread_settings
from torchspark.training.worker.prefetch import prefetch
from torchspark.training.worker.resuming import resume_epoch

__all__ = ["epoch_order", "ItemSource", "run_worker", "load_item", "batch_loader"]

log = logging.getLogger(__name__)


def epoch_order(rng_seed: int, epoch: int, rank: int, length: int) -> list[int]:
    """This worker's minibatch order in ``epoch``: a permutation of ``range(length)`` fixed by the seed, the epoch
    number and the rank (the same on Spark and in ParallelWrapper)."""
    return np.random.default_rng([epoch_seed(rng_seed, epoch), rank]).permutation(length).tolist()


def _barrier(comm: Communicator, device: Any) -> None:
    """Every rank waits here until all arrive (a one-element all-reduce: what the checkpoint commit needs)."""
    comm.all_reduce_sum(torch.zeros(1, device=device))


def load_item(item: Any) -> Batch:
    """A batch from whatever a data source yields: a batch, a batch-file path, slices of batch files
    (`FileSlices`, the balanced export route), or serialized batch bytes."""
    if isinstance(item, (DataSet, MultiDataSet)):
        return item
    if isinstance(item, str):
        return load_batch(item)
    if isinstance(item, FileSlices):
        return item.load()
    if isinstance(item, EpochItems):  # the driver's sample check: the epoch's first minibatch
        if not item.items:
            raise DataError(f"epoch {item.epoch} plans no minibatches for this worker")
        return load_item(item.items[0])
    if isinstance(item, (bytes, bytearray, memoryview)):
        return dataset_from_bytes(bytes(item))
    raise TypeError(f"cannot turn a {type(item).__name__} into a minibatch")


def batch_loader(pin_memory: bool | None, device: str) -> Callable[[Any], Batch]:
    """What the loading thread does to each item: `load_item`, then, when the worker pins
    (`pins_memory`: a CUDA device and ``pin_memory`` not False), a copy
    into pinned host memory, so that the training thread's ``.to(device, non_blocking=True)`` runs beside compute.
    On a CPU device this is `load_item` itself (pinning needs CUDA)."""
    if not pins_memory(pin_memory, device):
        return load_item
    return _load_pinned


def _load_pinned(item: Any) -> Batch:
    return load_item(item).pin_memory()


class ItemSource:
    """Items from an iterator, remembered during the first epoch so later epochs replay them.

    For a Spark partition iterator (read once) this keeps the partition's batches in the worker's memory across
    epochs, like an RDD persisted in memory. Serialized batches (bytes) are decoded once, during the first epoch
    (on the prefetch thread), and kept decoded: later epochs replay ready minibatches without decoding or a
    prefetch thread. Batch-file paths and FileSlices (the ``export`` approach) cost only their names and are read
    every epoch.
    """

    def __init__(self, items: Iterable[Any]) -> None:
        self._items: Iterator[Any] | None = None
        self._cache: list[Any] = []
        self._planned: Iterator[EpochItems] | None = None
        self._pending: Any = _NOTHING
        self._first_epoch = 0
        if _ready(items):
            self._cache = list(items)
            return
        it = iter(items)
        first = next(it, _NOTHING)
        if isinstance(first, EpochItems):  # the driver planned every epoch: read them in turn, never cached
            self._planned, self._pending, self._first_epoch = it, first, first.epoch
        else:
            self._items = iter(()) if first is _NOTHING else itertools.chain([first], it)

    @property
    def planned(self) -> bool:
        """Whether every epoch's items were planned by the driver (`EpochItems`), already in order."""
        return self._planned is not None

    def epoch(self, index: int, order: Callable[[int], Sequence[int]] | None = None) -> Iterable[Any]:
        """The items of the fit's epoch ``index``; ``order(length)``, when given, permutes them (a replay, or a
        first pass read whole first)."""
        if self._planned is not None:
            return self._planned_epoch(self._first_epoch + index)
        if self._items is not None and order is not None:  # read the partition whole, then train it in order
            for _ in self._first_pass():
                pass
        if self._items is None:
            return list(self._cache) if order is None else [self._cache[k] for k in order(len(self._cache))]
        return self._first_pass()

    def _planned_epoch(self, epoch: int) -> Iterator[Any]:
        """The items of the `EpochItems` numbered ``epoch`` (consecutive in the stream; none: an epoch
        without minibatches for this worker). Streamed: the direct route's minibatches of later epochs stay in
        Spark's shuffle files until their epoch."""
        assert self._planned is not None
        head = self._pending
        if head is _NOTHING or head.epoch != epoch:
            return
        while True:
            yield from head.items
            nxt = next(self._planned, _NOTHING)
            if nxt is _NOTHING or nxt.epoch != head.epoch:
                self._pending = nxt
                return
            head = nxt

    def _first_pass(self) -> Iterator[Any]:
        assert self._items is not None
        for item in self._items:
            if isinstance(item, (bytes, bytearray, memoryview)):
                item = load_item(item)
            self._cache.append(item)
            yield item
        self._items = None


def run_worker(
    task: WorkerTask,
    source: EpochSource,
    comm: Communicator,
    device: str = "cpu",
    hooks: WorkerHooks | None = None,
    network_factory: Callable[[WorkerTask, str], Network] | None = None,
) -> WorkerResult:
    """Train this worker's share for ``task.epochs`` epochs and return its result.

    Every step that waits on peers goes through ``comm`` (collectives with a timeout), every wait for data
    through the prefetcher (``data_timeout_s``), so a stuck peer or source fails instead of hanging.
    """
    hooks = hooks or WorkerHooks()
    # set before the network is built, restored at the end (a reused Spark Python worker runs other tasks next)
    with task_thread_settings(task.num_threads, task.flush_denormal):
        return _train(task, source, comm, device, hooks, network_factory)


def _train(
    task: WorkerTask,
    source: EpochSource,
    comm: Communicator,
    device: str,
    hooks: WorkerHooks,
    network_factory: Callable[[WorkerTask, str], Network] | None,
) -> WorkerResult:
    with hooks.recorder.phase("network_init"):
        net = (network_factory or _build_network)(task, device)
    algorithm = ALGORITHMS[task.mode].from_settings(task.settings)
    state = algorithm.start(net, comm)
    progress = RankProgress()
    first_epoch, skip, restored = 0, 0, None
    if task.resume is not None:  # this rank's own state and data position from the checkpoint
        restored = restore_rank(task.resume, comm.rank, comm.world_size, net)
        skip, progress = restored.done, restored.progress
        algorithm.restore(state, net, restored.algo_tensors, restored.algo_meta)
        first_epoch = task.resume.fit_epoch
    writer = None
    if task.checkpoint is not None:
        writer = CheckpointWriter(
            task.checkpoint,
            comm.rank,
            comm.world_size,
            task.mode,
            task.settings,
            task.blueprint,
            step=task.resume.step if task.resume is not None else 0,
            barrier=lambda: _barrier(comm, net.device),
        )
    for e in range(first_epoch):  # epochs the checkpoint says are done: read past them untrained (a source may
        for _ in _epoch_items(
            task, source, e, comm.rank
        ):  # hand its epochs out in order only, or cache its items on the first pass)
            pass
    for e in range(first_epoch, task.epochs):
        items = _epoch_items(task, source, e, comm.rank)
        length = len(items) if isinstance(items, (list, tuple)) else None
        start: Position | None = None
        if restored is not None and e == first_epoch:  # skip what the checkpoint says is done, once it is checked
            restart = task.checkpoint is not None and task.checkpoint.restart_epoch
            items, skip, start = resume_epoch(restored, e, items, load_item, restart)
        loaded = _batches(task, source, items, batch_loader(task.pin_memory, str(net.device)))
        tap = None if writer is None else PositionTap(start)  # fingerprints what a cut inside the epoch trained
        batches = group_batches(loaded if tap is None else tap(loaded), task.accumulate_steps)
        epoch_hooks = (
            hooks
            if writer is None or tap is None
            else dataclasses.replace(
                hooks,
                checkpoint=_round_checkpoint(
                    writer, net, e, skip, progress, hooks.recorder, task.accumulate_steps, length, tap
                ),
            )
        )
        outcome = algorithm.epoch(state, net, batches, comm, epoch_hooks, e)
        progress.examples += outcome.examples
        progress.iterations += outcome.iterations
        if outcome.iterations or not skip:  # a resumed epoch whose part after the cut was empty keeps its score
            progress.score = outcome.last_score
        skip = 0
        net.epoch += 1
        if writer is not None:
            with hooks.recorder.phase("checkpoint"):
                writer.epoch_end(net, e + 1, e + 1 == task.epochs, progress, *algorithm.rank_state(state))
    extra_state, extra_config = algorithm.finish(state, net, comm)
    if writer is not None:
        # every rank's last file must be written before rank 0 prunes to the limit; sharing's finish is collective
        # but averaging's is not, so one tiny all-reduce as a barrier (without it a slow peer's file of the newest
        # checkpoint was still missing, rank 0 pruned around it, and keep_checkpoints + 1 were left)
        comm.all_reduce_sum(torch.zeros(1, device=net.device))
        writer.close()
    drain = getattr(hooks.recorder, "drain", None)
    lead = comm.rank == 0
    return WorkerResult(
        rank=comm.rank,
        examples=progress.examples,
        iterations=progress.iterations,
        score=progress.score,
        params=net.params().cpu() if lead else None,
        updater_state=net.updater_state().cpu() if lead else None,
        scaler_state=net.amp.state_tensors() if lead else {},
        buffers=net.buffer_state() if lead else None,
        extra_state=extra_state,
        extra_config=extra_config if lead else {},
        stats=drain() if drain is not None else None,
        threads=torch.get_num_threads(),
        param_checksum=param_checksum(net),
    )


def _round_checkpoint(
    writer: CheckpointWriter,
    net: Network,
    fit_epoch: int,
    skipped: int,
    progress: RankProgress,
    recorder: Any,
    accumulate_steps: int,
    epoch_length: int | None = None,
    tap: PositionTap | None = None,
) -> Callable[[Any, dict[str, Any], dict[str, Any]], None]:
    """The ``hooks.checkpoint`` of one epoch: the fit's totals and the data position at a cut inside the epoch
    (``skipped``: minibatches of this epoch done before a resume, which the loop's own count does not include).

    The loop counts optimizer steps, each ``accumulate_steps`` minibatches: only an epoch's last group can be
    shorter, and past it nothing is left to skip, so ``steps * accumulate_steps`` is the minibatches done.
    ``tap`` fingerprints the epoch's minibatches: the cut records the fingerprint of those done."""

    def checkpoint(outcome: Any, algo_tensors: dict[str, Any], algo_meta: dict[str, Any]) -> None:
        totals = RankProgress(
            progress.examples + outcome.examples,
            progress.iterations + outcome.iterations,
            outcome.last_score if outcome.iterations else progress.score,
        )
        done = skipped + outcome.iterations * accumulate_steps
        if tap is not None:  # past a short last group: the epoch's stream ended at what the tap saw
            done = min(done, tap.seen)
        with recorder.phase("checkpoint"):
            writer.round_end(
                net,
                fit_epoch,
                done,
                totals,
                algo_tensors,
                algo_meta,
                epoch_length,
                None if tap is None else tap.at(done),
            )

    return checkpoint


def _epoch_items(task: WorkerTask, source: EpochSource, e: int, rank: int) -> Iterable[Any]:
    """Epoch ``e``'s items: with ``shuffle_seed``, every epoch after the network's first in a new seeded order."""
    absolute = task.first_epoch + e
    if task.shuffle_seed is None or absolute == 0 or not isinstance(source, ItemSource) or source.planned:
        return source.epoch(e)
    seed = task.shuffle_seed
    return source.epoch(e, lambda length: epoch_order(seed, absolute, rank, length))


def _batches(
    task: WorkerTask, source: EpochSource, items: Iterable[Any], load: Callable[[Any], Batch] = load_item
) -> Iterator[Batch]:
    """The epoch's minibatches, each through ``load`` (`batch_loader`): ready ones as they are when ``load``
    has nothing to do (pinning them goes through the prefetcher: the copy runs on its thread); without prefetch,
    straight from a source whose waits are already bounded by ``data_timeout_s`` (``bounded_wait``: a queue fed by
    the parent); else through the prefetcher, which bounds every wait by ``data_timeout_s`` (with ``prefetch=0``
    too, without read-ahead)."""
    if load is load_item and _ready(items):
        return iter(items)
    if task.prefetch <= 0 and getattr(source, "bounded_wait", False):
        return map(load, items)
    return prefetch(items, task.prefetch, task.data_timeout_s, transform=load)


def _ready(items: Iterable[Any]) -> bool:
    """Whether ``items`` are minibatches already in memory: a prefetch thread would only add a hand-off per step
    (BENCHMARKS.md, "Measurements behind design choices") and compete with training for the GIL."""
    return isinstance(items, (list, tuple)) and all(isinstance(i, (DataSet, MultiDataSet)) for i in items)


_NOTHING: Any = object()  # the end-of-stream sentinel: compared by identity only


def _build_network(task: WorkerTask, device: str) -> Network:
    return NetworkBlueprint.from_bytes(task.blueprint).build(device)
