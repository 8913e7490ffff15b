"""Elastic recovery: a fit that goes on with fewer workers when an attempt cannot get them all back, and grows back
when capacity returns.

With ``min_workers`` below ``num_workers`` on the training master, the driver's recovery
(`torchspark.training.driver.fit.run_fit`) chooses the world size of each new attempt ([`next_world`][torchspark.training.driver.elastic.next_world], a
pure policy):

1. **shrink** when the runner reports fewer free worker slots than the failed attempt had (an executor gone for
   good, dynamic allocation taking executors away: [`Elastic`][torchspark.training.driver.elastic.Elastic] ``capacity``), or when the same rank was lost in
   two attempts in a row at this size (a slot that keeps dying: a bad host, a device that keeps failing); never
   below ``min_workers``;
2. **grow back** to ``num_workers`` (or as many as the runner can start) at the next attempt after a shrink
   (``regrow`` ``"epoch"`` or ``"attempt"``; ``"never"`` keeps the smaller world);
3. otherwise keep the size (today's recovery).

**Growing back at an epoch boundary** (``regrow="epoch"``, the default with a ``checkpoint_directory``): while the
world is smaller than ``num_workers``, each attempt runs to the next epoch boundary only (its task's ``epochs``
end there, so the workers finish cleanly with the epoch's checkpoint, and no failure is recorded); the driver then
asks the runner for its capacity ([`grow_at_boundary`][torchspark.training.driver.elastic.grow_at_boundary]: Spark's free task slots; ``ParallelWrapper`` cannot
tell, and takes the devices it was given as there) and either grows (re-sharding that checkpoint, re-dealing the
data) or runs the next epoch at the same size. If the attempt right after such a growth loses a worker, the capacity
did not hold (a slot that still dies): the world goes back to its size before, that failure does not count against
``max_failures`` (it was the driver's try, not a new fault), and the fit stops growing at epoch boundaries (a later
failure may still grow it, as ``"attempt"`` does). So a slot that is bad for good costs one failed attempt, not one
per epoch.

A new size restarts from the newest checkpoint, **re-sharded** for the new world by [`reshard_checkpoint`][torchspark.training.driver.elastic.reshard_checkpoint]
(a new checkpoint written next to it, so the workers' resume is the one they always run), and the adapter re-deals
the data over the new number of workers ([`Elastic`][torchspark.training.driver.elastic.Elastic] ``data_for``). Each change is a [`WorldChange`][torchspark.training.driver.elastic.WorldChange] in
``summary()["world_changes"]``.

What the re-sharding does with each rank's state (new rank ``r`` of ``n``, old world ``N``):

* parameters: rank 0's (identical on every rank at a checkpoint's cut, for both masters);
* updater state, buffers, random streams, counters: old rank ``r``'s (``r % N`` for a new rank when growing);
  parameter averaging averages them at every round anyway, gradient sharing at the end of the fit;
* gradient sharing's **residuals** (the update mass each rank still owes the parameters): shrinking, new rank ``r``
  gets the **sum** of the old ranks ``j`` with ``j % n == r``, and a rank's pending message (encoded at the cut but
  not sent) is decoded back into its residual first, so no update is lost or applied twice; growing, the new ranks
  start with zero residuals: old rank ``r`` keeps its own residual as new rank ``r`` (growing back after a shrink,
  new rank 0 holds the merged residual of every rank it took over; the ranks that return start owing nothing), so
  every update still owed is owed exactly once. The **threshold state** of every new rank is the mean over the old ranks
  ([`average_states`][torchspark.encoding.average_states], as the end of a fit reconciles it);
* the data position inside an interrupted epoch: the minibatches the old ranks had consumed, in total, are dealt
  evenly over the new ranks (each skips its share of the re-dealt epoch). The re-dealt epoch holds the same
  examples over other workers, so the examples skipped are not exactly those trained before the cut: the count of
  work is kept (nothing trained twice in bulk, nothing lost beyond the checkpoint interval), not the identity of
  each example. A checkpoint at an epoch's end (the default ``checkpoint_every=None``) has nothing to deal;
* the fit's totals (examples, iterations): summed over the merged ranks, so the fit's totals stay right.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from torchspark.encoding.threshold import ThresholdState, average_states
from torchspark.training.algorithms.sharing.rounds import dense_sum, parse_gathered
from torchspark.training.checkpoint import store
from torchspark.training.checkpoint.config import ResumePoint
from torchspark.training.driver.resume import find_resume_point
from torchspark.training.task import WorkerTask

__all__ = [
    "Elastic",
    "WorldChange",
    "WorldTracker",
    "grow_at_boundary",
    "next_world",
    "repeated_rank",
    "reshard_checkpoint",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorldChange:
    """One change of a fit's world size, as ``summary()["world_changes"]`` lists it (JSON through [`to_dict`][torchspark.training.driver.elastic.WorldChange.to_dict]).

    Attributes:
        attempt: the attempt that runs at the new size.
        epoch: the epoch of the fit it restarts in (0-based, from its checkpoint; 0 without one).
        old, new: the world sizes before and after.
        reason: why (the capacity the runner reported, the rank that kept dying, capacity returned).
        time: wall-clock time of the decision (the driver's ``time.time()``).
    """

    attempt: int
    epoch: int
    old: int
    new: int
    reason: str
    time: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Elastic:
    """What an adapter hands `run_fit` so a fit can change its world size.

    Args:
        num_workers: the size the fit asks for (and grows back to).
        min_workers: the fewest workers it goes on with (``min_workers`` of the master).
        data_for: the workers' data re-dealt over ``n`` workers, in the form the runner takes.
        capacity: how many workers the runner can start now (free task slots); None: the runner cannot tell
            (local processes), then only a rank that keeps dying shrinks the world, and growing back takes every
            worker it was given as there.
        regrow: when a smaller world grows back: ``"epoch"`` (at the next epoch boundary with the capacity back;
            needs checkpoints), ``"attempt"`` (at its next failure) or ``"never"`` (the master's ``regrow``,
            resolved: never None here).
    """

    num_workers: int
    min_workers: int
    data_for: Callable[[int], Any]
    capacity: Callable[[], int | None] | None = None
    regrow: str = "attempt"

    def free_slots(self) -> int | None:
        """The runner's capacity now (None: unknown)."""
        return None if self.capacity is None else self.capacity()


def repeated_rank(lost: Sequence[tuple[int | None, int]], world: int) -> int | None:
    """The rank lost in each of the last two attempts when both ran with ``world`` workers (``lost``: each failed
    attempt's ``(rank, world size)``, oldest first), else None."""
    if len(lost) < 2:
        return None
    (a, wa), (b, wb) = lost[-2], lost[-1]
    return b if a is not None and a == b and wa == wb == world else None


def grow_at_boundary(current: int, target: int, capacity: int | None) -> tuple[int, str]:
    """The world size after an epoch boundary (or a failure) of a world of ``current`` workers, and why (``""``:
    unchanged): as many as ``capacity`` allows up to ``target`` (None: the runner cannot tell, so all of them)."""
    grown = target if capacity is None else min(target, capacity)
    return (grown, "capacity returned") if grown > current else (current, "")


def next_world(
    current: int,
    target: int,
    min_workers: int,
    capacity: int | None,
    repeated: int | None,
    regrow: bool = True,
) -> tuple[int, str]:
    """The world size of the next attempt and why (``""``: unchanged). Steps 1-3 of the module docstring.

    Args:
        current: the failed attempt's world size.
        target: ``num_workers``.
        min_workers: the floor.
        capacity: workers the runner can start now (None: unknown).
        repeated: the rank lost in the last two attempts at this size ([`repeated_rank`][torchspark.training.driver.elastic.repeated_rank]), or None.
        regrow: whether a smaller world may grow back (False: ``regrow="never"``).
    """
    if capacity is not None and capacity < current:
        if capacity >= min_workers:
            return capacity, f"only {capacity} worker slot(s) left after the failure"
        return current, ""  # below the floor: retry at this size as a fit without min_workers would
    if repeated is not None:  # a slot that keeps dying: one fewer, never more
        if current > min_workers:
            return current - 1, f"worker {repeated} was lost in two attempts in a row"
        return current, ""
    return grow_at_boundary(current, target, capacity) if regrow else (current, "")


def _members(new_rank: int, old: int, new: int) -> list[int]:
    """The old ranks whose state new rank ``new_rank`` takes over: shrinking, every ``j`` with ``j % new == new_rank``;
    growing, its own (none for a rank the old world did not have)."""
    if new <= old:
        return [j for j in range(old) if j % new == new_rank]
    return [new_rank] if new_rank < old else []


def _residual(tensors: dict[str, torch.Tensor], length: int) -> torch.Tensor:
    """An old rank's residual with its pending message (encoded, not sent) decoded back into it."""
    residual = tensors["algo.residual"].reshape(-1).to(torch.float32).clone()
    pending = tensors.get("algo.pending")
    if pending is not None:
        _, messages = parse_gathered([bytes(pending.numpy().tobytes())], length)
        owed = dense_sum(messages, length, "cpu")
        if owed is not None:
            residual += owed
    return residual


def _merged_rank(
    rank: int, old_files: list[tuple[dict[str, torch.Tensor], dict[str, Any]]], new: int, done: int
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """New rank ``rank``'s file from the old ranks' files (the module docstring's rules)."""
    old = len(old_files)
    members = _members(rank, old, new)
    tensors, meta = old_files[rank % old]
    tensors = {k: v for k, v in tensors.items() if not k.startswith("algo.") and (k != "params" or rank == 0)}
    meta = {**meta, "rank": rank, "done": done, "epoch_length": None, "position": None}  # re-dealt: no fingerprint
    meta["examples"] = sum(int(old_files[j][1]["examples"]) for j in members)
    meta["iterations"] = sum(int(old_files[j][1]["iterations"]) for j in members)
    if "algo.residual" in old_files[0][0]:  # gradient sharing
        length = old_files[0][0]["algo.residual"].numel()
        residual = torch.zeros(length, dtype=torch.float32)
        for j in members:
            residual += _residual(old_files[j][0], length)
        states = [ThresholdState.from_tensor(f[0]["algo.threshold_state"]) for f in old_files]
        tensors["algo.residual"] = residual
        tensors["algo.threshold_state"] = average_states(states).to_tensor()
        algo = dict(meta.get("algo") or {})
        for key in ("bytes_sent", "dense_bytes", "steps"):
            algo[key] = sum(int((old_files[j][1].get("algo") or {}).get(key, 0)) for j in members)
        meta["algo"] = algo
    return tensors, meta


def reshard_checkpoint(point: ResumePoint, new: int) -> int:
    """Write checkpoint ``point`` again for ``new`` workers, as the next step of its run; returns that step.

    The re-sharded checkpoint is a complete checkpoint of the run (rank files, then the manifest, which records
    ``resharded_from``), numbered after every step directory the run has (an incomplete newer one included), so
    the next attempt's resume finds it as the newest and its writers continue after it.

    Raises:
        CheckpointDamaged: an old rank file cannot be read (the caller's resume then falls back as usual).
    """
    found = store.load_checkpoint(point.step, point.path)
    if found is None:
        raise FileNotFoundError(f"checkpoint {point.path} is no longer complete")
    old_files = [store.read_rank_file(point.path, r) for r in range(point.world_size)]
    total_done = sum(int(m["done"]) for _, m in old_files)
    directory, run_id = point.path.rstrip("/").rsplit("/", 2)[0], point.run_id
    step = max(s for s, _ in store.step_directories(directory, run_id)) + 1
    path = store.step_directory(directory, run_id, step)
    for rank in range(new):
        done = total_done // new + (1 if rank < total_done % new else 0)
        tensors, meta = _merged_rank(rank, old_files, new, done)
        store.write_rank_file(path, rank, tensors, {**meta, "step": step})
    manifest = {k: v for k, v in found.manifest.items() if k not in ("format", "version")}
    manifest.update(
        step=step,
        world_size=new,
        files=[f"rank-{r}.safetensors" for r in range(new)],
        written_at=time.time(),
        resharded_from={"step": point.step, "world_size": point.world_size},
    )
    store.write_manifest(path, manifest)
    log.info("re-sharded checkpoint %s (%d workers) for %d workers as %s", point.path, point.world_size, new, path)
    return step


class WorldTracker:
    """The world size of a fit's attempts, and the data for it (the driver's recovery loop holds one per fit).

    Args:
        elastic: the fit's [`Elastic`][torchspark.training.driver.elastic.Elastic] (None: the world never changes).
        data: the workers' data the fit starts with (``elastic.num_workers`` workers).
    """

    def __init__(self, elastic: Elastic | None, data: Any) -> None:
        self.elastic = elastic
        #: the data the next attempt runs on
        self.data = data
        #: the next attempt's world size (None: not elastic)
        self.world = None if elastic is None else elastic.num_workers
        #: every change so far, oldest first
        self.changes: list[WorldChange] = []
        self._lost: list[tuple[int | None, int]] = []
        #: the attempt that starts with a growth at an epoch boundary (None: none pending)
        self._grown_for: int | None = None
        #: whether the world may still grow at epoch boundaries (False after a growth that did not hold)
        self._epoch_growth = elastic is not None and elastic.regrow == "epoch"

    def bounded(self, task: WorkerTask) -> WorkerTask:
        """Attempt task ``task``, ending at the next epoch boundary when the world may grow there (a smaller world,
        ``regrow="epoch"``); else unchanged."""
        e = self.elastic
        if e is None or self.world is None or self.world >= e.num_workers or not self._epoch_growth:
            return task
        boundary = (0 if task.resume is None else task.resume.fit_epoch) + 1
        return replace(task, epochs=min(task.epochs, boundary))

    def at_boundary(self, attempt: int, task: WorkerTask) -> None:
        """A bounded attempt ([`bounded`][torchspark.training.driver.elastic.WorldTracker.bounded]) ended cleanly at an epoch boundary: grow attempt ``attempt``'s world
        when the capacity is back ([`grow_at_boundary`][torchspark.training.driver.elastic.grow_at_boundary])."""
        assert self.elastic is not None and self.world is not None
        new, reason = grow_at_boundary(self.world, self.elastic.num_workers, self.elastic.free_slots())
        if new != self.world:
            self._change(attempt, task, new, reason)
            self._grown_for = attempt

    def counts_failure(self, attempt: int) -> int:
        """1 when the failure of attempt ``attempt - 1`` counts against ``max_failures``; 0 when that attempt was the
        first after a growth at an epoch boundary (the growth did not hold: the module docstring)."""
        return 0 if self._grown_for is not None and self._grown_for == attempt - 1 else 1

    def after_failure(self, rank: int | None, attempt: int, task: WorkerTask) -> None:
        """Attempt ``attempt - 1`` lost rank ``rank`` (None: unknown): choose attempt ``attempt``'s world size
        ([`next_world`][torchspark.training.driver.elastic.next_world]; after a growth that did not hold, the size before it, and no more growth at epoch
        boundaries); on a change re-shard the run's newest checkpoint ([`reshard_checkpoint`][torchspark.training.driver.elastic.reshard_checkpoint]) and re-deal the
        data."""
        if self.elastic is None or self.world is None:
            return
        e, old = self.elastic, self.world
        self._lost.append((rank, old))
        if not self.counts_failure(attempt):
            self._grown_for, self._epoch_growth = None, False
            back, slots = self.changes[-1].old, e.free_slots()
            if slots is not None and e.min_workers <= slots < back:  # and fewer slots than before the growth
                back = slots
            who = "a worker" if rank is None else f"worker {rank}"
            self._change(attempt, task, back, f"capacity did not hold: {who} lost after growing back")
            return
        self._grown_for = None
        repeated = repeated_rank(self._lost, old)
        new, reason = next_world(old, e.num_workers, e.min_workers, e.free_slots(), repeated, e.regrow != "never")
        if new != old:
            self._change(attempt, task, new, reason)

    def _change(self, attempt: int, task: WorkerTask, new: int, reason: str) -> None:
        """Attempt ``attempt`` runs ``new`` workers: re-shard the newest checkpoint, re-deal the data, record it."""
        assert self.elastic is not None and self.world is not None
        old = self.world
        point = find_resume_point(task)
        if point is not None and point.world_size != new:
            reshard_checkpoint(point, new)
        self.data = self.elastic.data_for(new)
        self.world = new
        change = WorldChange(attempt, 0 if point is None else point.fit_epoch, old, new, reason, time.time())
        self.changes.append(change)
        log.warning("elastic recovery: attempt %d runs %d workers instead of %d (%s)", attempt, new, old, reason)
