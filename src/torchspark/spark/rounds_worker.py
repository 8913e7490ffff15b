"""The executor side of parameter averaging with one Spark job per round (``averaging_via="spark"``): what
travels between the driver and the tasks, and what one task does in a round.

The driver side and the steps of a fit are in `torchspark.spark.rounds`. Here: the fit's `FitSpec`
(broadcast once per fit), a round's `RoundInput` (broadcast every round), `count_items` (step 1: the
minibatches of every partition), `fit_round_partition` (step 4: fit this partition's share of the round from
the broadcast state, through the one worker body `worker_main`) and the `RoundRecord` it yields, which
``treeAggregate`` sums with `merge_records`. Every function is module-level, so Spark ships it by reference.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from typing import Any, cast

import torch

from torchspark.data import group_batches
from torchspark.nn import Network, NetworkBlueprint
from torchspark.nn.cache import NetworkCache
from torchspark.spark.task_bootstrap import set_up_task
from torchspark.training.algorithms.averaging import AveragingSettings, pack_weighted, train_round
from torchspark.training.algorithms.base import EpochOutcome
from torchspark.training.hooks import PhaseRecorder, WorkerHooks
from torchspark.training.task import WorkerTask
from torchspark.training.worker.body import RankSetup, worker_main
from torchspark.training.worker.loop import batch_loader
from torchspark.training.worker.prefetch import prefetch

__all__ = ["FitSpec", "RoundInput", "RoundRecord", "WorkerRound", "count_items", "fit_round_partition", "merge_records"]


# ------------------------------------------------------------------ what travels
@dataclass(frozen=True)
class FitSpec:
    """What every round of one fit shares; broadcast once per fit.

    Args:
        fit_id: names this fit in the workers' network cache.
        task: the fit's task: the network's blueprint at the start of the fit, the data and thread options, the
            averaging settings (a round fits ``averaging_frequency * accumulate_steps`` minibatches).
        gpu_dry_run: record the GPUs Spark assigns but train on the CPU (a testing aid:
            `torchspark.spark.gpus.dry_run_requested`).
    """

    fit_id: str
    task: WorkerTask
    gpu_dry_run: bool = False

    @property
    def averaging(self) -> AveragingSettings:
        return AveragingSettings(**self.task.settings)


@dataclass(frozen=True)
class RoundInput:
    """The state one round starts from; broadcast every round.

    Args:
        epoch: epoch of the fit (0-based); ``round``: round within the epoch (0-based).
        iteration: the driver network's iteration counter before the round (for the workers' error messages).
        params: ``(P,)`` parameters, the network's dtype.
        updater_state: ``(S,)`` float32 updater state; None = reset the updater before fitting.
        buffers: ``(B,)`` float32 floating-point module buffers (BatchNorm running statistics), averaged like the
            parameters.
        int_buffers: integer buffers by name (BatchNorm's ``num_batches_tracked``): worker 0's values, as the
            torch route returns them.
    """

    epoch: int
    round: int
    iteration: int
    params: torch.Tensor
    updater_state: torch.Tensor | None
    buffers: torch.Tensor | None = None
    int_buffers: dict[str, torch.Tensor] | None = None


@dataclass
class WorkerRound:
    """What one worker did in one round."""

    examples: int = 0
    iterations: int = 0
    score: float = math.nan  # loss of its last minibatch in the round
    stats: dict[str, Any] | None = None  # StatsCollector payload when collecting stats
    #: where the round's task ran (`WorkerEnv.where`: device, the GPU addresses Spark assigned to it, executor)
    placement: dict[str, Any] | None = None


@dataclass
class RoundRecord:
    """One partition's contribution to a round, and the sum of several (what ``treeAggregate`` adds up)."""

    weighted: torch.Tensor | None = None  # (P + S + B,) float32: params*n | updater_state*n | buffers*n
    examples: int = 0  # n: examples fitted
    score_sum: float = 0.0  # last minibatch loss * n
    workers: dict[int, WorkerRound] = field(default_factory=dict)
    int_buffers: dict[str, torch.Tensor] | None = None  # worker 0's integer buffers when it trained this round


def merge_records(a: RoundRecord, b: RoundRecord) -> RoundRecord:
    """Sum two records (``treeAggregate``'s seqOp and combOp). ``a`` is updated in place and returned.

    In-place is safe: Spark hands every call freshly deserialized records (or the per-task copy of the zero value).
    """
    if b.weighted is not None:
        a.weighted = b.weighted if a.weighted is None else a.weighted.add_(b.weighted)
    a.examples += b.examples
    a.score_sum += b.score_sum
    a.workers.update(b.workers)
    if b.int_buffers is not None:
        a.int_buffers = b.int_buffers
    return a


# ------------------------------------------------------------------ worker side
# The network a Python worker built for a fit, keyed by fit id and device: a reused Python worker trains every
# round of the fit with it instead of rebuilding it from the blueprint. One copy per key (a Python worker runs one
# task at a time); the networks of finished fits are evicted oldest first.
_NETWORKS = NetworkCache(max_keys=2)


def count_items(index: int, items: Iterable[Any]) -> Iterator[tuple[int, int]]:
    """``mapPartitionsWithIndex`` function of step 1: ``(partition, number of minibatches)``."""
    yield index, sum(1 for _ in items)


def fit_round_partition(spec_bc: Any, round_bc: Any, index: int, items: Iterable[Any]) -> Iterator[RoundRecord]:
    """``mapPartitionsWithIndex`` function of one round (step 4): fit this partition's share, yield one record."""
    spec: FitSpec = spec_bc.value
    rnd: RoundInput = round_bc.value
    per_round = (
        spec.averaging.averaging_frequency * spec.task.accumulate_steps
    )  # f optimizer steps of k minibatches each
    it = iter(items)
    chunk = list(islice(it, rnd.round * per_round, (rnd.round + 1) * per_round))  # paths or serialized batches
    for _ in it:  # read to the end: a Python worker that leaves input unread is not reused (and would rebuild)
        pass
    if not chunk:  # this worker's data ran out: it joins the round with n = 0
        yield RoundRecord()
        return
    from pyspark import TaskContext

    setup = set_up_task(TaskContext.get(), spec.gpu_dry_run)
    # no rendezvous (the driver averages); the task's cores and flush mode while it trains, restored after
    env = setup.worker_env(index, flush_denormal=spec.task.flush_denormal, collect_stats=spec.task.collect_stats)
    yield cast(RoundRecord, worker_main(env, partial(_fit_round, spec, rnd, chunk)))


def _fit_round(spec: FitSpec, rnd: RoundInput, chunk: list[Any], rank: RankSetup) -> RoundRecord:
    """Step 4 of `torchspark.spark.rounds` on this partition: set the round's state, fit ``chunk``, weigh the
    result."""
    env, recorder = rank.env, rank.hooks.recorder
    with _NETWORKS.lease(f"{spec.fit_id}/{env.device}", 1, partial(_build, spec, env.device, recorder)) as net:
        record = _fit_leased(net, spec, rnd, env.rank, chunk, rank.hooks)
    record.workers[env.rank].placement = env.where()
    return record


def _fit_leased(
    net: Network, spec: FitSpec, rnd: RoundInput, index: int, chunk: list[Any], hooks: WorkerHooks
) -> RoundRecord:
    net.set_params(rnd.params)
    if rnd.int_buffers:
        net.load_buffer_state(rnd.int_buffers)
    if rnd.buffers is not None:
        net.set_buffers(rnd.buffers)
    if rnd.updater_state is not None:
        net.set_updater_state(rnd.updater_state)
    else:
        net.reset_updater_state()
    net.iteration = rnd.iteration
    done = _fit_chunk(net, chunk, spec, rnd, index, hooks)
    w = float(done.examples)
    weighted = pack_weighted(net, w, spec.averaging.save_updater).cpu()  # (P + S + B,): the all-reduce route's packing
    drain = getattr(hooks.recorder, "drain", None)
    done.stats = drain() if drain is not None else None
    int_buffers = integer_buffers(net) if index == 0 else None
    return RoundRecord(
        weighted=weighted,
        examples=done.examples,
        score_sum=done.score * w,
        workers={index: done},
        int_buffers=int_buffers,
    )


def integer_buffers(net: Network) -> dict[str, torch.Tensor]:
    """The network's integer buffers by name (BatchNorm's ``num_batches_tracked``): not averaged, worker 0's kept."""
    return {k: v for k, v in net.buffer_state().items() if not v.is_floating_point()}


def _build(spec: FitSpec, device: str, recorder: PhaseRecorder) -> Network:
    with recorder.phase("network_init"):
        return NetworkBlueprint.from_bytes(spec.task.blueprint).build(device)


def _fit_chunk(
    net: Network, chunk: Sequence[Any], spec: FitSpec, rnd: RoundInput, index: int, hooks: WorkerHooks
) -> WorkerRound:
    """Fit the round's minibatches in order with the averaging loop's step loop (`train_round`), one optimizer
    step per ``accumulate_steps`` of them (the fit's first step validates its input)."""
    task = spec.task
    load = batch_loader(task.pin_memory, str(net.device))
    batches = prefetch(chunk, task.prefetch, task.data_timeout_s, transform=load)
    groups = iter(group_batches(batches, task.accumulate_steps))
    out = EpochOutcome()
    try:
        with hooks.recorder.phase("data_wait"):
            upcoming = next(groups, None)
        first = rnd.epoch == 0 and rnd.round == 0
        train_round(net, groups, upcoming, spec.averaging.averaging_frequency, out, hooks, index, rnd.epoch, first)
        return WorkerRound(examples=out.examples, iterations=out.iterations, score=out.last_score)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # stops the prefetch thread when a step raised
