"""Turning data into minibatches: split one dataset, or re-batch a stream of datasets of any sizes.

[`rebatch`][torchspark.data.rebatch] is what the Spark export step runs on each partition (DL4J's BatchAndExportDataSetsFunction):
partitions hold DataSets of whatever size the user produced; workers want files of exactly ``batch_size``.
[`recut`][torchspark.data.recut] is the general form (pieces of given sizes) that the balanced routes use to cut a partition where
the plan of `torchspark.training.assignment` says.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Union, cast

import numpy as np

from torchspark.data.dataset import DataSet, MultiDataSet
from torchspark.data.torchdata import is_torch_data, torch_batches
from torchspark.errors import DataError

__all__ = ["Batch", "iterate_minibatches", "rebatch", "recut", "merge_batches"]

Batch = Union[DataSet, MultiDataSet]


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise DataError(f"batch_size must be an int >= 1, got {batch_size!r}")


def merge_batches(items: Sequence[Batch]) -> Batch:
    """Concatenate batches of one kind (all DataSets or all MultiDataSets) along the example dimension, in order.

    Example: ``merge_batches([ds.slice(0, 8), ds.slice(8, 16)])`` equals ``ds.slice(0, 16)``.
    """
    kind = type(items[0])  # DataSet.merge / MultiDataSet.merge refuse a mixed list with a DataError
    return kind.merge(cast(Any, items))


def _checked_items(stream: Iterable[Batch], what: str) -> Iterator[Batch]:
    try:
        iterator = iter(stream)
    except TypeError as exc:
        raise DataError(
            f"{what} needs a DataSet, a MultiDataSet or an iterable of them, got {type(stream).__name__}"
        ) from exc
    for position, item in enumerate(iterator):
        if not isinstance(item, (DataSet, MultiDataSet)):
            raise DataError(
                f"{what}: item {position} of the stream is a {type(item).__name__}, expected a DataSet or "
                f"MultiDataSet; wrap arrays with DataSet(features, labels), or pass the torch Dataset or "
                f"DataLoader itself (its tensor, tuple and dict batches are converted)"
            )
        yield item


def iterate_minibatches(data: Batch | Iterable[Batch], batch_size: int) -> Iterator[Batch]:
    """Yield minibatches for training.

    Args:
        data: a DataSet/MultiDataSet, split into consecutive minibatches of ``batch_size`` (last may be
            smaller); a PyTorch ``DataLoader`` (its batches, converted by `torchspark.data.torchdata`), map-style
            ``Dataset`` or ``IterableDataset`` (read in ``batch_size`` batches, in order); or any iterable of
            DataSets/MultiDataSets (e.g. a generator reading batch files), whose items are used as they come
            (``batch_size`` is then only validated; use [`rebatch`][torchspark.data.rebatch] to resize).
        batch_size: examples per minibatch, >= 1.

    Raises:
        DataError: bad ``batch_size``; ``data`` is not iterable; an item is not a DataSet/MultiDataSet, or a
            PyTorch batch of a form not taken (the message names its type and position).
    """
    _check_batch_size(batch_size)
    if isinstance(data, (DataSet, MultiDataSet)):
        yield from data.split(batch_size)
    elif is_torch_data(data):
        yield from torch_batches(data, batch_size, "iterate_minibatches")
    else:
        yield from _checked_items(data, "iterate_minibatches")


def rebatch(stream: Iterable[Batch], batch_size: int) -> Iterator[Batch]:
    """Re-cut a stream of datasets of any sizes into batches of exactly ``batch_size`` examples, in order.

    Memory: holds fewer than ``batch_size`` pending examples plus the current input item.

    Args:
        stream: DataSets or MultiDataSets (not mixed; all with the same labels/masks present).
        batch_size: examples per output batch, >= 1. For files that workers train on, use the per-worker
            minibatch size so each file is one step.

    Raises:
        DataError: bad ``batch_size``; an item is not a DataSet/MultiDataSet; items cannot be merged.
    """
    _check_batch_size(batch_size)
    yield from _cut(stream, itertools.repeat(batch_size), "rebatch")


def recut(stream: Iterable[Batch], sizes: Iterable[int]) -> Iterator[Batch]:
    """Re-cut a stream of datasets into consecutive pieces of ``sizes[0]``, ``sizes[1]``, ... examples, in order.

    [`rebatch`][torchspark.data.rebatch] is ``recut(stream, repeat(batch_size))``; the balanced Spark routes cut each input partition at
    the places their plan says (`torchspark.training.assignment`).

    Steps: (1) take examples from the current item until the pending piece is full; (2) when full, merge the
    pending parts and yield them, then move to the next size; (3) keep an incomplete tail as a copy so the big item
    it came from can be freed; (4) when the stream ends, yield the remainder (the only piece that may be smaller
    than its size). Examples left over when ``sizes`` runs out are dropped, so callers that must see every example
    compare the yielded lengths with what they expected.

    Memory: holds fewer than one piece of pending examples plus the current input item.

    Raises:
        DataError: a size < 1; an item is not a DataSet/MultiDataSet; items cannot be merged.
    """
    yield from _cut(stream, sizes, "recut")


def _cut(stream: Iterable[Batch], sizes: Iterable[int], what: str) -> Iterator[Batch]:
    targets = iter(sizes)
    target = _next_size(targets, what)
    pending: list[Batch] = []
    pending_n = 0
    kind: type[DataSet] | type[MultiDataSet] | None = None
    for position, item in enumerate(_checked_items(stream, what)):
        kind = kind or type(item)
        if type(item) is not kind:
            raise DataError(
                f"{what}: item {position} of the stream is a {type(item).__name__} but earlier items "
                f"are {kind.__name__}s; do not mix them (DataSet.to_multi converts)"
            )
        start, n = 0, len(item)
        while start < n and target is not None:
            take = min(target - pending_n, n - start)  # (1)
            piece = item if (start == 0 and take == n) else item.slice(start, start + take)
            start += take
            if pending_n + take == target:  # (2)
                yield merge_batches([*pending, piece]) if pending else piece
                pending, pending_n = [], 0
                target = _next_size(targets, what)
            else:  # (3) only an item's tail can leave the piece incomplete
                pending.append(piece._map(lambda t: t.clone()))
                pending_n += take
    if pending:  # (4)
        yield merge_batches(pending)


def _next_size(sizes: Iterator[int], what: str) -> int | None:
    size = next(sizes, None)
    if size is not None and (not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1):
        raise DataError(f"{what}: piece sizes must be ints >= 1, got {size!r}")
    return None if size is None else int(size)
