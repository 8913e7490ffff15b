"""Gradient accumulation's view of a minibatch stream: ``k`` consecutive minibatches (micro-batches) trained as
one optimizer step.

With ``accumulate_steps=k`` a worker (or ``Network.fit``) trains its minibatches of ``batch_size`` in groups of
``k``: the gradients of the group's micro-batches add up in ``.grad`` and the updater steps once, as if it had
trained one batch of ``k * batch_size`` examples (``Network.train_group``), while only one micro-batch's
activations are held at a time. [`group_batches`][torchspark.data.group_batches] cuts the stream; an epoch whose minibatch count is not a
multiple of ``k`` ends with one shorter group (its step then averages over fewer examples, as a short last
minibatch does). With ``k = 1`` the stream passes through unchanged, and [`as_group`][torchspark.data.as_group] lets a training loop treat
either kind of item the same way.

Example::

    for item in group_batches(data.split(32), 4):     # one optimizer step per 4 x 32 examples
        net.train_group(as_group(item))
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Union

from torchspark.data.batching import Batch
from torchspark.data.dataset import DataSet, MultiDataSet

__all__ = ["BatchGroup", "Trainable", "group_batches", "as_group", "group_examples"]


class BatchGroup(tuple):
    """Consecutive minibatches trained as one optimizer step: a tuple of batches that knows its example count.

    ``len(group)`` is the number of micro-batches (it is a tuple of them); [`examples`][torchspark.data.BatchGroup.examples] (and
    [`group_examples`][torchspark.data.group_examples]) the examples they hold together.
    """

    @property
    def examples(self) -> int:
        """Examples in all micro-batches together."""
        return sum(len(b) for b in self)


#: what a training loop gets from a grouped stream: a minibatch (``k = 1``) or a group of them
Trainable = Union[DataSet, MultiDataSet, BatchGroup]


def group_batches(batches: Iterable[Batch], k: int) -> Iterable[Trainable]:
    """The stream in groups of ``k`` consecutive minibatches (the last group of a stream may be shorter).

    ``k = 1`` returns ``batches`` itself: no wrapping, no extra work per step. Lazy otherwise: a group is read from
    the stream only when the loop asks for it, so a prefetcher's read-ahead and timeouts still apply per
    minibatch.
    """
    if k == 1:
        return batches
    return _groups(iter(batches), k)


def _groups(it: Iterator[Batch], k: int) -> Iterator[BatchGroup]:
    while True:
        group = BatchGroup(itertools.islice(it, k))
        if not group:
            return
        yield group


def as_group(item: Trainable | Sequence[Batch]) -> Sequence[Batch]:
    """The micro-batches of one optimizer step: ``(item,)`` for a single minibatch, the item itself for a group."""
    if isinstance(item, (DataSet, MultiDataSet)):
        return (item,)
    return item


def group_examples(item: Trainable | Sequence[Batch]) -> int:
    """Examples one optimizer step trains on: ``len(batch)`` for a minibatch, the sum over a group's micro-batches."""
    if isinstance(item, (DataSet, MultiDataSet)):
        return len(item)
    return sum(len(b) for b in item)
