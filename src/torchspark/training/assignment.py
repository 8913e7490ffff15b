"""Which worker trains which examples: deterministic plans shared by Spark and ParallelWrapper.

Two plans live here.

**Exact balance** (`plan_balanced`, used by ``repartition_strategy="balanced"`` on both Spark routes and by
ParallelWrapper for in-memory data). It gives every one of ``n`` workers ``floor(N/n)`` or ``ceil(N/n)`` of the
``N`` examples, in minibatches of ``batch_size`` except at most a short first and a short last one per worker:

1. Lay one *grid* over the examples in data order (input partition 0, then 1, ...): grid minibatch ``g`` holds
   global examples ``[g*B, (g+1)*B)``; only the last one may be short. The grid depends on ``N`` and ``B`` alone,
   not on how the data is partitioned, so Spark (many partitions) and ParallelWrapper (one DataSet) agree.
2. Order the grid minibatches: with ``rng_seed``, a seeded permutation of the full ones; the short remainder
   stays last, so it can only end the last worker's sequence.
3. Read the ordered minibatches as one sequence of ``N`` examples and cut it at ``w*N//n`` for ``w = 0..n``:
   worker ``w`` gets the range ``[w*N//n, (w+1)*N//n)``. A grid minibatch that a cut falls into becomes a short
   last minibatch of one worker and a short first minibatch of the next.
4. Split every worker minibatch at input-partition boundaries into *pieces* ``(partition, start, stop)`` (in the
   partition's own example numbering). A minibatch is the concatenation of its pieces in data order; most have
   one piece, only those that straddle a partition boundary have more.
5. No accidental 1-example minibatches (BatchNorm cannot train on one example): when ``batch_size > 1``, a
   worker's minibatch of one example is merged into that worker's neighbouring minibatch (the previous one, or
   the next one when it is the first), which then holds ``batch_size + 1`` examples (``+ 2`` when a worker's
   first and last minibatches both join the one between them). Only a worker with one
   example in all keeps it (66 examples, 2 workers, batch 16: worker 0 trains 16 + 17, not 16 + 16 + 1).

``drop_last=True`` (as ``torch.utils.data.DataLoader``'s): every minibatch holds exactly ``batch_size`` examples.
The ``N % batch_size`` examples of the short grid remainder are not trained, and whole grid minibatches are dealt
to the workers (``floor`` or ``ceil`` of ``N // batch_size`` over ``n`` each), so no cut falls inside one.

Consumers turn pieces into data where the data lives: the ``direct`` route cuts each partition into its pieces on
the executors and shuffles them to their workers (`torchspark.spark.data.worker_rdd_balanced`); the
``export`` route writes files cut on the grid and partition boundaries (`grid_heads`), and a worker loads a
minibatch as a whole file or as `FileSlices`; ParallelWrapper slices its in-memory data
(`split_examples`). All three give identical per-worker minibatch sequences for the same seed.

**User batch files** (`plan_files`, Spark's ``fit_paths`` and ParallelWrapper's path route): files of any
size are re-batched to ``batch_size`` as DL4J does, by the exact-balance plan with every file taken as one input
partition, so ``batch_size_per_worker`` means the same on every route. Workers read whole files or
`FileSlices` (a file larger than the batch size is read once per minibatch cut from it, so files of
``batch_size`` examples, e.g. ``save_batches(data.split(batch_size))``, are read once per epoch).

**Whole items** (`assign_balanced`, `split_for_workers`): items trained as they are, one minibatch
each, so only their count can be balanced: minibatch ``p`` of ``L`` (after an optional seeded permutation) goes to
worker ``p * n // L``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from torchspark.data import Batch, DataSet, MultiDataSet, load_batch
from torchspark.data.batching import merge_batches
from torchspark.errors import ConfigError, DataError

__all__ = [
    "BalancedPlan",
    "EpochItems",
    "FileSlices",
    "check_loader",
    "epoch_seed",
    "load_with",
    "plan_balanced",
    "grid_heads",
    "split_examples",
    "file_items",
    "plan_files",
    "per_epoch",
    "check_global_plan_size",
    "MAX_GLOBAL_PLAN_ITEMS",
    "assign_balanced",
    "split_for_workers",
]

T = TypeVar("T")


# ------------------------------------------------------------------ epochs
def epoch_seed(rng_seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch``'s order: ``rng_seed`` itself for epoch 0, then a fresh seed per epoch drawn from
    ``(rng_seed, epoch)`` alone, so the order of any epoch is a pure function of the seed and the epoch number
    (the network's epoch counter: two ``fit(epochs=1)`` calls train two different orders, as one ``fit(epochs=2)``
    does, and a run resumed at epoch ``e`` replays epoch ``e``'s order)."""
    if epoch == 0:
        return rng_seed
    return int(np.random.SeedSequence([rng_seed, epoch]).generate_state(1, np.uint64)[0] >> 1)


@dataclass(frozen=True)
class EpochItems:
    """One epoch's minibatch items of one worker (paths or `FileSlices`): the routes that can give every
    epoch a new order across workers (files: only names travel) hand each worker one of these per epoch."""

    epoch: int
    items: tuple[Any, ...]


# ------------------------------------------------------------------ exact balance
@dataclass(frozen=True, eq=False)
class BalancedPlan:
    """The pieces of every worker's minibatches; one row per piece, sorted by (worker, position, begin).

    Attributes (int64 arrays of one length, ``S`` pieces):
        worker: the worker that trains the piece.
        position: index of the piece's minibatch in that worker's sequence.
        partition: the input partition holding the piece.
        start, stop: the piece's examples in the partition's own numbering.
        begin: the piece's first example in the global numbering (data order); orders pieces in a minibatch.
        num_workers: ``n``.
        sizes: examples in each input partition (all of them, trained or dropped).
    """

    worker: np.ndarray
    position: np.ndarray
    partition: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    begin: np.ndarray
    num_workers: int
    sizes: np.ndarray | None = None

    def examples_per_worker(self) -> list[int]:
        """How many examples each worker trains per epoch (they differ by at most one)."""
        counts = np.bincount(self.worker, weights=self.stop - self.start, minlength=self.num_workers)
        return [int(c) for c in counts]

    def minibatches(self, worker: int) -> list[np.ndarray]:
        """Worker ``worker``'s minibatches in training order, each as the row indices of its pieces."""
        rows = np.flatnonzero(self.worker == worker)
        if rows.size == 0:
            return []
        breaks = np.flatnonzero(np.diff(self.position[rows])) + 1
        return np.split(rows, breaks)

    def partition_rows(self, partition: int) -> np.ndarray:
        """Row indices of the pieces of one input partition, in the partition's order (they tile it, except for
        examples ``drop_last`` dropped at its end)."""
        rows = np.flatnonzero(self.partition == partition)
        return rows[np.argsort(self.start[rows], kind="stable")]


def plan_balanced(
    sizes: Sequence[int], batch_size: int, num_workers: int, rng_seed: int | None, drop_last: bool = False
) -> BalancedPlan:
    """Plan exactly balanced per-worker minibatches over partitions of ``sizes`` examples (steps in the module doc).

    Args:
        sizes: examples in each input partition, in data order (zeros allowed).
        batch_size: examples per minibatch (``batch_size_per_worker``).
        num_workers: ``n``; when there are fewer examples than workers, some workers get none.
        rng_seed: seeds the order of the full grid minibatches; None keeps data order.
        drop_last: train only full minibatches of ``batch_size`` (the remainder is dropped; workers then differ by
            up to one minibatch instead of one example).
    Raises:
        ConfigError: ``batch_size`` or ``num_workers`` < 1. DataError: a negative size, no examples at all, or
        (with ``drop_last``) fewer examples than ``batch_size``.
    """
    if batch_size < 1 or num_workers < 1:
        raise ConfigError(f"batch_size and num_workers must be >= 1, got {batch_size} and {num_workers}")
    part_size = np.asarray(list(sizes), dtype=np.int64)
    if (part_size < 0).any():
        raise DataError(f"partition sizes must be >= 0, got {part_size.tolist()}")
    total = int(part_size.sum())
    if total == 0:
        raise DataError("the training data is empty: the RDD holds no examples")
    b, n = batch_size, num_workers
    if drop_last and total < b:
        raise DataError(
            f"drop_last=True drops every example: the data holds {total} examples, fewer than "
            f"batch_size={b}; lower the batch size or set drop_last=False"
        )
    # 1. the grid: minibatch g = global examples [g*b, g*b + length[g]); drop_last keeps the full ones only
    full = total // b
    grid = full if drop_last else -(-total // b)
    used = grid * b if drop_last else total
    length = np.full(grid, b, dtype=np.int64)
    length[-1] = used - (grid - 1) * b
    # 2. slot k of the training sequence holds grid minibatch order[k]; the short remainder stays last
    order = np.arange(grid, dtype=np.int64)
    if rng_seed is not None:
        order[:full] = np.random.default_rng(rng_seed).permutation(full)
    slot_of = np.empty(grid, dtype=np.int64)
    slot_of[order] = np.arange(grid)
    slot_start = np.concatenate([[0], np.cumsum(length[order])])  # (grid + 1,) sequence offset of every slot
    # 3. worker cuts in the sequence (drop_last: on slot boundaries), and where the inner ones fall globally
    ranks = np.arange(n + 1, dtype=np.int64)
    cuts = slot_start[ranks * grid // n] if drop_last else ranks * used // n
    inner = cuts[1:-1]
    cut_slot = np.minimum(np.searchsorted(slot_start, inner, side="right") - 1, grid - 1)
    cut_global = np.where(inner >= used, used, order[cut_slot] * b + (inner - slot_start[cut_slot]))
    # 4. pieces: cut the global numbering at grid, partition and worker boundaries
    part_start = np.concatenate([[0], np.cumsum(part_size)])
    bounds = np.unique(np.concatenate([np.arange(0, used, b), part_start[part_start <= used], cut_global, [used]]))
    begin, end = bounds[:-1], bounds[1:]
    slot = slot_of[begin // b]
    in_sequence = slot_start[slot] + begin - (begin // b) * b
    worker = np.searchsorted(cuts, in_sequence, side="right") - 1  # 'right': skips workers with no examples
    first_slot = np.searchsorted(slot_start, cuts[:-1], side="right") - 1
    partition = np.searchsorted(part_start, begin, side="right") - 1  # 'right': skips empty partitions
    rows = np.lexsort((begin, slot, worker))
    worker, slot, partition, begin, end = worker[rows], slot[rows], partition[rows], begin[rows], end[rows]
    position = slot - first_slot[worker]
    if b > 1:  # 5.
        position = _merge_single_examples(worker, position, end - begin)
        # pieces of a minibatch in data order (a merged one spans two slots), as every consumer joins them
        rows = np.lexsort((begin, position, worker))
        worker, position, partition, begin, end = worker[rows], position[rows], partition[rows], begin[rows], end[rows]
    return BalancedPlan(
        worker=worker,
        position=position,
        partition=partition,
        start=begin - part_start[partition],
        stop=end - part_start[partition],
        begin=begin,
        num_workers=n,
        sizes=part_size,
    )


def _merge_single_examples(worker: np.ndarray, position: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Step 5: positions renumbered so that a 1-example minibatch shares its neighbour's (pieces sorted by
    worker, position, begin; a worker's minibatches are numbered 0, 1, ... again afterwards)."""
    key = worker * (int(position.max()) + 2) + position  # one value per (worker, minibatch), increasing
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    examples = np.bincount(inverse, weights=size)
    owner = worker[first]
    target = np.arange(len(uniq))
    for m in np.flatnonzero(examples == 1):
        if m > 0 and owner[m - 1] == owner[m]:
            target[m] = target[m - 1]  # into the previous minibatch (already final: merges go left first)
        elif m + 1 < len(uniq) and owner[m + 1] == owner[m]:
            target[m] = m + 1  # the worker's first minibatch: into the next one
    merged = target[inverse]
    # renumber per worker: rank of the merged minibatch among the worker's minibatches
    group_first = np.concatenate([[True], (merged[1:] != merged[:-1])])
    counter = np.cumsum(group_first) - 1
    worker_first = np.concatenate([[True], worker[1:] != worker[:-1]])
    base = np.maximum.accumulate(np.where(worker_first, counter, 0))
    return (counter - base).astype(np.int64)


def grid_heads(sizes: Sequence[int], batch_size: int) -> list[int]:
    """For each partition, the examples before its first grid boundary (0 when it starts on one).

    Cutting partition ``p`` into ``heads[p]`` (when > 0), then ``batch_size``, ``batch_size``, ... examples cuts
    the data exactly on the grid and on partition boundaries: the export route's batch files. Every piece of any
    `plan_balanced` plan over these sizes lies inside one such file, whatever the seed or worker count.
    """
    offsets = np.concatenate([[0], np.cumsum(np.asarray(list(sizes), dtype=np.int64))[:-1]])
    return [int(h) for h in (-offsets) % batch_size]


def split_examples(
    batches: Sequence[Batch], batch_size: int, num_workers: int, rng_seed: int | None, drop_last: bool = False
) -> list[list[Batch]]:
    """In-memory data cut into per-worker minibatches by `plan_balanced`, each item of ``batches`` taken as
    one input partition (ParallelWrapper's route: the same minibatches as Spark for the same data and seed)."""
    plan = plan_balanced([len(b) for b in batches], batch_size, num_workers, rng_seed, drop_last)
    out: list[list[Batch]] = []
    for w in range(num_workers):
        minibatches = []
        for rows in plan.minibatches(w):
            pieces = [batches[int(plan.partition[r])].slice(int(plan.start[r]), int(plan.stop[r])) for r in rows]
            minibatches.append(pieces[0] if len(pieces) == 1 else merge_batches(pieces))
        out.append(minibatches)
    return out


@dataclass(frozen=True)
class FileSlices:
    """A minibatch made of parts of batch files: ``(path, start, stop)`` slices concatenated in order.

    The export route's item for a minibatch that is not one whole file (cut by a worker boundary, or straddling an
    input-partition boundary). Workers read the files every epoch, as they read whole-file paths.
    """

    slices: tuple[tuple[str, int, int], ...]
    #: the user's ``path -> DataSet`` function for files that are not batch files (``fit_paths(loader=...)``)
    loader: Callable[[str], Batch] | None = None

    def load(self) -> Batch:
        parts = [
            (load_batch(path) if self.loader is None else load_with(self.loader, path)).slice(start, stop)
            for path, start, stop in self.slices
        ]
        return parts[0] if len(parts) == 1 else merge_batches(parts)


def check_loader(loader: Any) -> None:
    """ConfigError unless ``loader`` is None or a function ``path -> DataSet`` (the ``loader=`` of the path methods)."""
    if loader is not None and not callable(loader):
        raise ConfigError(f"loader must be a function path -> DataSet, got {type(loader).__name__}")


def load_with(loader: Callable[[str], Batch], path: str) -> Batch:
    """``loader(path)``, checked: it must return a DataSet or MultiDataSet (DL4J's ``DataSetLoader``).

    Raises:
        DataError: the loader returned something else; the message names the path and the type.
    """
    batch = loader(path)
    if not isinstance(batch, (DataSet, MultiDataSet)):
        raise DataError(
            f"the loader returned a {type(batch).__name__} for {path}; it must return a DataSet or "
            "MultiDataSet (e.g. DataSet(features, labels))"
        )
    return batch


def file_items(
    plan: BalancedPlan, files: Sequence[tuple[int, str, int]], loader: Callable[[str], Batch] | None = None
) -> list[list[str | FileSlices]]:
    """Every worker's minibatches as export items: a path when the minibatch is one whole file, else FileSlices.

    Args:
        plan: from `plan_balanced` over the partition sizes the files were cut with.
        files: ``(partition, path, examples)`` of every batch file in data order, cut as `grid_heads` says.
        loader: read the files with this ``path -> DataSet`` function (every item is then a FileSlices).
    Raises:
        DataError: the files do not cover the plan's examples (the data changed between counting and export).
    """
    examples = np.asarray([f[2] for f in files], dtype=np.int64)
    file_begin = np.concatenate([[0], np.cumsum(examples)])
    total = int(plan.sizes.sum()) if plan.sizes is not None else int(plan.stop.sum() - plan.start.sum())
    if int(file_begin[-1]) != total:
        raise DataError(
            f"the export holds {int(file_begin[-1])} examples but the data had {total} when counted; "
            "the RDD must give the same data every time it is computed (persist it, or seed its "
            "sampling)"
        )
    index = np.searchsorted(file_begin, plan.begin, side="right") - 1
    offset = plan.begin - file_begin[index]
    size = plan.stop - plan.start
    if (offset + size > examples[index]).any():
        raise DataError("a planned minibatch piece crosses a batch-file boundary: the export was not cut on the grid")
    items: list[list[str | FileSlices]] = []
    for w in range(plan.num_workers):
        mine: list[str | FileSlices] = []
        for rows in plan.minibatches(w):
            slices = tuple((files[int(index[r])][1], int(offset[r]), int(offset[r] + size[r])) for r in rows)
            whole = len(rows) == 1 and offset[rows[0]] == 0 and size[rows[0]] == examples[index[rows[0]]]
            mine.append(slices[0][0] if whole and loader is None else FileSlices(slices, loader))
        items.append(mine)
    return items


def plan_files(
    files: Sequence[tuple[str, int]],
    batch_size: int,
    num_workers: int,
    rng_seed: int | None,
    loader: Callable[[str], Batch] | None = None,
    drop_last: bool = False,
) -> list[list[str | FileSlices]]:
    """User batch files of any size re-batched to ``batch_size``: every worker's minibatches as export items.

    Args:
        files: ``(path, examples)`` of every file, in data order ([`torchspark.data.batch_num_examples`][torchspark.data.batch_num_examples]
            reads the count from a file's header).
        batch_size: examples per minibatch (``batch_size_per_worker``).
        num_workers: ``n``; workers get ``floor`` or ``ceil`` of the examples over ``n``.
        rng_seed: seeds the order of the full minibatches; None keeps data order.
        loader: the user's ``path -> DataSet`` function when the files are not batch files.
        drop_last: only full minibatches (see `plan_balanced`).
    Raises:
        DataError: the files hold no examples at all.
    """
    plan = plan_balanced([n for _, n in files], batch_size, num_workers, rng_seed, drop_last)
    return file_items(plan, [(k, path, n) for k, (path, n) in enumerate(files)], loader)


#: the most items (minibatches or files, over all workers and epochs) one ``shuffle_scope="global"`` fit plans up
#: front: about 100 bytes each on the driver and in the task closures, so 2 M is ~200 MB
MAX_GLOBAL_PLAN_ITEMS = 2_000_000


def check_global_plan_size(items_per_epoch: int, epochs: int) -> None:
    """ConfigError when a ``shuffle_scope="global"`` fit would plan more than `MAX_GLOBAL_PLAN_ITEMS` items:
    that scope deals every epoch's items to the workers before the fit starts (``epochs=10**8`` ran the driver out
    of memory after a minute instead of saying so)."""
    if items_per_epoch * epochs > MAX_GLOBAL_PLAN_ITEMS:
        raise ConfigError(
            f"shuffle_scope='global' plans every epoch of a fit up front: epochs={epochs} x {items_per_epoch} items "
            f"per epoch = {items_per_epoch * epochs:,} planned items, more than {MAX_GLOBAL_PLAN_ITEMS:,}; use "
            "shuffle_scope='worker' (the default: one plan per fit, each worker reorders its items every epoch), or "
            "fit fewer epochs per call (fit(data, epochs=k) in a loop continues the epoch count and the shuffle)"
        )


def per_epoch(
    plan: Callable[[int | None], list[list[T]]],
    num_workers: int,
    rng_seed: int | None,
    first_epoch: int,
    epochs: int | None,
    scope: str = "global",
) -> list[list[Any]]:
    """Every worker's items for a fit of ``epochs`` epochs starting at epoch ``first_epoch``.

    ``plan(seed)`` gives the per-worker items for one seed. Without ``rng_seed`` that is the fit's single plan,
    trained every epoch. With it and ``scope="worker"`` (the masters' default ``shuffle_scope``), the plan of
    ``rng_seed`` itself for every fit and epoch (each worker reorders its own items every epoch:
    `epoch_order`). With ``scope="global"``, every epoch gets the plan of
    `epoch_seed` ``(rng_seed, epoch)`` -- a new order across workers each epoch -- as one
    `EpochItems` per epoch and worker. ``epochs=None``: a route that cannot take per-epoch items (one Spark
    job per round) gets the first epoch's plan, plain.
    """
    if rng_seed is None:
        return plan(None)
    if scope == "worker":
        return plan(rng_seed)
    if epochs is None:
        return plan(epoch_seed(rng_seed, first_epoch))
    first = plan(epoch_seed(rng_seed, first_epoch))
    check_global_plan_size(sum(len(items) for items in first), epochs)
    plans = [first] + [plan(epoch_seed(rng_seed, first_epoch + e)) for e in range(1, epochs)]
    return [[EpochItems(first_epoch + e, tuple(plans[e][w])) for e in range(epochs)] for w in range(num_workers)]


# ------------------------------------------------------------------ whole items
def assign_balanced(total: int, num_workers: int, rng_seed: int | None) -> np.ndarray:
    """Worker index of each minibatch ``0..total-1``: contiguous, equal (+-1) blocks after an optional permutation.

    Returns ``(worker, position)`` pairs packed as an ``(total, 2)`` int64 array: minibatch ``g`` goes to
    ``worker[g]`` at ``position[g]`` in that worker's order.
    """
    order = np.arange(total) if rng_seed is None else np.random.default_rng(rng_seed).permutation(total)
    slot = np.empty(total, dtype=np.int64)
    slot[order] = np.arange(total)  # slot[g]: where minibatch g lands in the permuted order
    workers = slot * num_workers // max(total, 1)
    return np.stack([workers, slot], axis=1)


def split_for_workers(items: Sequence[T], num_workers: int, rng_seed: int | None) -> list[list[T]]:
    """``items`` split into per-worker lists following `assign_balanced`."""
    plan = assign_balanced(len(items), num_workers, rng_seed)
    buckets: list[list[tuple[int, T]]] = [[] for _ in range(num_workers)]
    for item, (w, pos) in zip(items, plan):
        buckets[int(w)].append((int(pos), item))
    return [[x for _, x in sorted(b, key=lambda t: t[0])] for b in buckets]
