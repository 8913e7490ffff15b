"""Turning data into minibatches: split one dataset, or re-batch a stream of datasets of any sizes.

:func:`rebatch` is what the Spark export step runs on each partition (DL4J's BatchAndExportDataSetsFunction):
partitions hold DataSets of whatever size the user produced; workers want files of exactly ``batch_size``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Union

from torchspark.data.dataset import DataSet, MultiDataSet
from torchspark.errors import DataError

__all__ = ["Batch", "iterate_minibatches", "rebatch"]

Batch = Union[DataSet, MultiDataSet]


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise DataError(f"batch_size must be an int >= 1, got {batch_size!r}")


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
                f"MultiDataSet; wrap arrays with DataSet(features, labels)"
            )
        yield item


def iterate_minibatches(data: Batch | Iterable[Batch], batch_size: int) -> Iterator[Batch]:
    """Yield minibatches for training.

    Args:
        data: a DataSet/MultiDataSet, split into consecutive minibatches of ``batch_size`` (last may be
            smaller); or any iterable of DataSets/MultiDataSets (e.g. a generator reading batch files), whose
            items are used as they come (``batch_size`` is then only validated; use :func:`rebatch` to resize).
        batch_size: examples per minibatch, >= 1.

    Raises:
        DataError: bad ``batch_size``; ``data`` is not iterable; an item is not a DataSet/MultiDataSet (the
            message names its type and position).
    """
    _check_batch_size(batch_size)
    if isinstance(data, (DataSet, MultiDataSet)):
        yield from data.split(batch_size)
    else:
        yield from _checked_items(data, "iterate_minibatches")


def rebatch(stream: Iterable[Batch], batch_size: int) -> Iterator[Batch]:
    """Re-cut a stream of datasets of any sizes into batches of exactly ``batch_size`` examples, in order.

    Steps: (1) take examples from the current item until the pending batch is full; (2) when full, merge the
    pending pieces and yield them; (3) keep an incomplete tail as a copy so the big item it came from can be
    freed; (4) at the end, yield the remainder (the only batch that may be smaller).

    Memory: holds fewer than ``batch_size`` pending examples plus the current input item.

    Args:
        stream: DataSets or MultiDataSets (not mixed; all with the same labels/masks present).
        batch_size: examples per output batch, >= 1. For files that workers train on, use the per-worker
            minibatch size so each file is one step.

    Raises:
        DataError: bad ``batch_size``; an item is not a DataSet/MultiDataSet; items cannot be merged.
    """
    _check_batch_size(batch_size)
    pending: list[Batch] = []
    pending_n = 0
    kind: type[DataSet] | type[MultiDataSet] | None = None
    for position, item in enumerate(_checked_items(stream, "rebatch")):
        kind = kind or type(item)
        if type(item) is not kind:
            raise DataError(f"rebatch: item {position} of the stream is a {type(item).__name__} but earlier items "
                            f"are {kind.__name__}s; do not mix them (DataSet.to_multi converts)")
        start, n = 0, len(item)
        while start < n:
            take = min(batch_size - pending_n, n - start)  # (1)
            piece = item if (start == 0 and take == n) else item.slice(start, start + take)
            start += take
            if pending_n + take == batch_size:  # (2)
                yield kind.merge([*pending, piece]) if pending else piece
                pending, pending_n = [], 0
            else:  # (3) only an item's tail can leave the batch incomplete
                pending.append(piece._map(lambda t: t.clone()))
                pending_n += take
    if pending:  # (4)
        yield type(pending[0]).merge(pending)
