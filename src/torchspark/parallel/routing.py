"""How ``ParallelWrapper.fit`` splits its data over the workers, with the plans Spark uses.

In-memory data (a DataSet, a list of them) is balanced by examples (`split_examples`, Spark's
``repartition_strategy="balanced"``); batch files of any size are re-batched to ``batch_size`` and balanced
(`plan_files`, Spark's ``fit_paths``); a one-shot iterable is re-batched and dealt round-robin (one epoch only).
PyTorch data is first turned into one of those by `from_torch_data`: a map-style ``Dataset`` (or a ``DataLoader``
over one) is read once, in index order, into in-memory data, so each worker gets its own seeded shard; an
``IterableDataset`` is a one-shot stream. `route_data` returns a `DataPlan`: the workers' shares, a first minibatch to check the network against,
and the examples of one epoch. Example: ``route_data(train, workers=2, batch_size=32, epochs=1, rng_seed=0)``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from torchspark.data import DataSet, MultiDataSet, batch_num_examples, rebatch, resolve_paths
from torchspark.data.batching import merge_batches
from torchspark.data.torchdata import is_torch_data, torch_batches
from torchspark.errors import ConfigError, DataError
from torchspark.parallel.feeding import WorkerShares
from torchspark.training.assignment import (
    check_global_plan_size,
    epoch_seed,
    per_epoch,
    plan_files,
    split_examples,
)

__all__ = ["DataPlan", "route_data", "from_torch_data", "BATCH_TYPES", "PATH_TYPES"]

#: the in-memory data types a worker trains on
BATCH_TYPES = (DataSet, MultiDataSet)
#: what names batch files: a path, a directory or a glob
PATH_TYPES = (str, os.PathLike)


@dataclass
class DataPlan:
    """The workers' shares of the data, a first minibatch to check the network against, and the examples one
    epoch trains when known (the progress bar's total)."""

    sample: Any
    shares: WorkerShares
    examples: int | None = None


def from_torch_data(data: Any, batch_size: int, epochs: int) -> Any:
    """PyTorch data as the data `route_data` takes; anything else unchanged.

    * a map-style ``Dataset``, or a ``DataLoader`` over one: every example read once in index order (through the
      loader's ``collate_fn``) into one in-memory DataSet/MultiDataSet. `route_data` then gives each worker its own
      disjoint shard, whose union is the dataset, as ``DistributedSampler`` does: balanced by examples, reshuffled
      every epoch with the master's ``rng_seed`` (within each worker's shard with ``shuffle_scope="worker"``, across
      workers with ``"global"``). The loader's own shuffling and batching are replaced by this; a loader with a
      custom ``sampler`` or ``batch_sampler`` is refused (the workers could not honour it);
    * an ``IterableDataset``, or a ``DataLoader`` over one: a one-shot stream of its batches, re-batched to
      ``batch_size`` and dealt round-robin to the workers (one epoch a fit).

    Raises:
        ConfigError: a DataLoader with a custom sampler; an IterableDataset with ``epochs > 1``.
        DataError: a batch of a form `torchspark.data.torchdata.to_batch` does not take, or no examples.
    """
    if not is_torch_data(data):
        return data
    dataset = data.dataset if isinstance(data, DataLoader) else data
    what = f"ParallelWrapper.fit({type(data).__name__})"
    if isinstance(dataset, IterableDataset):
        if epochs != 1:
            raise ConfigError(
                f"an IterableDataset ({type(dataset).__name__}) is streamed to the workers once, round-robin, so a "
                f"fit trains one epoch, got epochs={epochs}; call fit once per epoch, or pass a map-style Dataset"
            )
        return torch_batches(data, batch_size, what)
    collate = None
    if isinstance(data, DataLoader):
        batcher = data.batch_sampler
        sampler = data.sampler if batcher is None else getattr(batcher, "sampler", batcher)
        if type(batcher) not in (BatchSampler, type(None)) or type(sampler) not in (SequentialSampler, RandomSampler):
            raise ConfigError(
                f"ParallelWrapper shards the DataLoader's dataset over the workers itself (seeded by rng_seed), so "
                f"it cannot honour the loader's {type(sampler).__name__}; pass the dataset, or a DataLoader "
                "without a sampler or batch_sampler (its collate_fn is used)"
            )
        collate = data.collate_fn if data.batch_size is not None else None  # batch_size=None: per-item convert
    reader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate)
    batches = list(torch_batches(reader, batch_size, what))
    if not batches or not sum(len(b) for b in batches):
        raise DataError(f"fit got no data: the {type(dataset).__name__} is empty")
    if len({type(b) for b in batches}) > 1:
        raise DataError(f"the {type(dataset).__name__}'s batches mix forms (DataSets and MultiDataSets); give one form")
    return merge_batches(batches)


def route_data(
    data: Any,
    workers: int,
    batch_size: int,
    epochs: int,
    rng_seed: int | None,
    first_epoch: int = 0,
    drop_last: bool = False,
    scope: str = "worker",
) -> DataPlan:
    """Split ``data`` over the workers with the plans Spark uses: in-memory data exactly balanced by examples
    (`split_examples`, Spark's ``repartition_strategy="balanced"``), batch files of any size re-batched to
    ``batch_size`` (`plan_files`, Spark's ``fit_paths``)."""
    if isinstance(data, BATCH_TYPES):
        if len(data) == 0:
            raise DataError("fit got an empty DataSet (0 examples)")
        return _feeds([data], workers, batch_size, rng_seed, epochs, first_epoch, drop_last, scope)
    if isinstance(data, PATH_TYPES):  # a directory, a glob or one batch file
        data = resolve_paths(data)
    if isinstance(data, bytes):
        raise DataError(
            "data is bytes; pass a DataSet, a list of them, or batch-file paths (load the bytes with "
            "torchspark.data.dataset_from_bytes)"
        )
    if not isinstance(data, Iterable):
        raise DataError(
            f"cannot train on a {type(data).__name__}; pass a DataSet, a list of DataSets or a list of "
            "batch-file paths (for Spark RDDs and DataFrames use SparkNetwork)"
        )
    items = iter(data)
    first = next(items, None)
    if first is None:
        raise DataError("fit got no data: the list or iterable is empty")
    if isinstance(first, PATH_TYPES):  # paths are cheap: always materialised, so any epochs work
        paths = _checked(itertools.chain([first], items), PATH_TYPES, "batch-file path")
        files = [(os.fspath(p), batch_num_examples(os.fspath(p))) for p in paths]  # re-batched, as fit_paths
        shares = per_epoch(
            lambda s: plan_files(files, batch_size, workers, s, drop_last=drop_last),
            workers,
            rng_seed,
            first_epoch,
            epochs,
            scope,
        )
        total = sum(n for _, n in files)
        return DataPlan(
            paths[0], WorkerShares(workers, paths=shares), total // batch_size * batch_size if drop_last else total
        )
    if isinstance(data, (list, tuple)):
        batches = _checked(data, BATCH_TYPES, "DataSet or MultiDataSet")
        if len({type(item) for item in batches}) > 1:
            raise DataError("data mixes DataSets and MultiDataSets; pass one kind (DataSet.to_multi converts)")
        if not any(len(item) for item in batches):
            raise DataError("fit got no data: every DataSet in the list is empty")
        return _feeds(batches, workers, batch_size, rng_seed, epochs, first_epoch, drop_last, scope)
    if epochs != 1:
        raise ConfigError(
            f"a one-shot iterable ({type(data).__name__}) trains one epoch only, got epochs={epochs}; "
            "pass a list (e.g. list(data)) or a DataSet to train several epochs"
        )
    if drop_last:
        raise ConfigError(
            f"drop_last=True needs data whose size is known before training (a DataSet, a list of them "
            f"or of batch-file paths), got a one-shot {type(data).__name__}; pass list(data)"
        )
    if not isinstance(first, BATCH_TYPES):
        raise DataError(f"data[0] is a {type(first).__name__}; expected a DataSet, MultiDataSet or batch-file path")
    return DataPlan(first, WorkerShares(workers, stream=rebatch(itertools.chain([first], items), batch_size)))


def _feeds(
    items: Sequence[Any],
    workers: int,
    batch_size: int,
    rng_seed: int | None,
    epochs: int = 1,
    first_epoch: int = 0,
    drop_last: bool = False,
    scope: str = "worker",
) -> DataPlan:
    """In-memory data: one plan replayed every epoch (each worker reorders its share every epoch with
    ``rng_seed``), or with ``scope="global"`` and ``rng_seed`` (past the network's first epoch, or over several) a new
    plan per epoch, as Spark's routes give them (`per_epoch`), fed to the
    workers epoch by epoch."""
    if rng_seed is None or scope == "worker" or (epochs == 1 and first_epoch == 0):
        feeds = split_examples(items, batch_size, workers, rng_seed, drop_last)
        return DataPlan(
            next(b for feed in feeds for b in feed),
            WorkerShares(workers, feeds=feeds),
            sum(len(b) for feed in feeds for b in feed),
        )
    first = split_examples(items, batch_size, workers, epoch_seed(rng_seed, first_epoch), drop_last)
    check_global_plan_size(sum(len(feed) for feed in first), epochs)
    plans = [first] + [
        split_examples(items, batch_size, workers, epoch_seed(rng_seed, first_epoch + e), drop_last)
        for e in range(1, epochs)
    ]
    sample = next(b for feed in plans[0] for b in feed)
    return DataPlan(
        sample,
        WorkerShares(workers, epoch_feeds=plans, first_epoch=first_epoch),
        sum(len(b) for feed in plans[0] for b in feed),
    )


def _checked(items: Iterable[Any], types: tuple[type, ...], what: str) -> list[Any]:
    out = list(items)
    for i, item in enumerate(out):
        if not isinstance(item, types):
            raise DataError(f"data[{i}] is a {type(item).__name__}; every item must be a {what} (do not mix them)")
    return out
