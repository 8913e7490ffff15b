"""Parameter averaging with one Spark job per round (``averaging_via="spark"``): DL4J's original route.

The default route (``averaging_via="torch"``) runs a whole fit inside one barrier stage whose tasks all-reduce
over ``torch.distributed``, so executors must reach each other on a port. This route needs nothing but Spark: the
driver broadcasts the parameters, every task trains from them and returns one record, ``treeAggregate`` sums the
records and the driver averages. It pays one Spark job and one broadcast per round (tens to hundreds of
milliseconds of scheduling each, whatever the model), but works wherever Spark jobs work, and since a round only
reads broadcasts and its own data, Spark may simply retry a failed task.

Per fit (driver, :class:`SparkRoundsRunner`, run by :func:`torchspark.training.driver.fit.run_fit`):
  1. count the minibatches of every worker partition (one small job); rounds per epoch = ceil(max count / (f * k))
     (``k`` = ``accumulate_steps``, minibatches per optimizer step; 1 without gradient accumulation);
  2. broadcast the task's network blueprint once (each Python worker builds the network once per fit and keeps it
     in its :class:`~torchspark.nn.cache.NetworkCache`).
Per round ``r`` of every epoch (the rounds and arithmetic of
:func:`torchspark.training.algorithms.averaging.averaging_epoch`):
  3. broadcast the current parameters and module buffers (the averaged floating-point ones, worker 0's integer
     ones), plus the updater state when ``save_updater`` (and in the fit's first round, which starts from the
     driver's updater state like the torch route's blueprint does);
  4. one job: each partition sets them (resetting the updater when no state came), fits its minibatches
     ``[r*f*k, (r+1)*f*k)`` (``f`` optimizer steps) and yields one :class:`RoundRecord` ``(params*n | updater_state*n | buffers*n, n, score*n)``; a
     partition with no minibatch left yields ``n = 0``; ``treeAggregate(depth=aggregation_depth)`` sums them;
  5. the driver sets ``params = sum(params*n) / sum(n)`` (likewise the floating-point buffers, and the updater
     state when ``save_updater``, else it resets it) --
     :func:`~torchspark.training.algorithms.averaging.apply_weighted_mean`, the all-reduce route's rule --, takes
     partition 0's integer buffers when it trained, and advances ``iteration`` by the round's most optimizer steps on
     one worker.
If a round fails or is interrupted, the driver's network holds the result of the last completed round. With a
``checkpoint_directory`` the driver checkpoints its network (once per epoch, or every ``checkpoint_every`` rounds;
:mod:`torchspark.spark.rounds_state`), so a retry after a lost executor, or a later fit with the same ``run_id``,
resumes from the newest checkpoint instead of the fit's start.

Progress listeners get one :class:`ProgressUpdate` per worker and round from the driver (no connection from the
executors to the driver is needed). ``last_results`` holds one :class:`WorkerResult` per worker with its totals
and its own last minibatch loss; rank 0 carries the final parameters. With ``collect_training_stats`` the workers'
``network_init`` / ``data_wait`` / ``fit`` phases are shipped in the round records, timed on the executors' own
clocks (this route has no channel to align them with the driver's clock).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from typing import Any

import torch

from torchspark.data import as_group, group_batches, group_examples
from torchspark.errors import ConfigError, TorchSparkError
from torchspark.nn import Network, NetworkBlueprint
from torchspark.nn.cache import NetworkCache
from torchspark.spark.broadcasts import destroy_broadcast
from torchspark.spark.data import storage_level_by_name
from torchspark.spark.gpus import GpuPlan, with_training_resources
from torchspark.spark.jobs import run_job
from torchspark.spark.rounds_state import RoundsCheckpoints, Tally
from torchspark.spark.task_bootstrap import executor_name, set_up_task
from torchspark.stats import StatsCollector
from torchspark.training.algorithms.averaging import AveragingSettings, apply_weighted_mean, pack_weighted
from torchspark.training.driver.runner import RunContext
from torchspark.training.hooks import PhaseRecorder
from torchspark.training.task import WorkerResult, WorkerTask
from torchspark.training.worker.devices import task_thread_settings
from torchspark.training.worker.loop import batch_loader
from torchspark.training.worker.prefetch import prefetch
from torchspark.training.worker.reporting import worker_id

__all__ = ["FitSpec", "RoundInput", "RoundRecord", "WorkerRound", "SparkRoundsRunner", "fit_round_partition",
           "merge_records"]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ what travels
@dataclass(frozen=True)
class FitSpec:
    """What every round of one fit shares; broadcast once per fit.

    Args:
        fit_id: names this fit in the workers' network cache.
        blueprint: ``NetworkBlueprint.to_bytes()`` of the driver's network at the start of the fit.
        averaging_frequency: optimizer steps per worker and round (``f``).
        accumulate_steps: minibatches per optimizer step (``k``): a round fits ``f * k`` minibatches.
        save_updater: return the updater state for averaging (else the driver resets it after every round).
        prefetch: minibatches loaded ahead on a background thread (0 = none).
        pin_memory: the master's ``pin_memory`` (pinned host memory for CUDA workers' minibatches).
        data_timeout_s: how long to wait for one minibatch before failing.
        collect_stats: record the workers' phases.
        flush_denormal: flush denormal floats to zero while the partition trains (the master's option).
        gpu_dry_run: record the GPUs Spark assigns but train on the CPU (a testing aid:
            :func:`torchspark.spark.gpus.dry_run_requested`).
    """

    fit_id: str
    blueprint: bytes
    averaging_frequency: int
    accumulate_steps: int = 1
    save_updater: bool = True
    prefetch: int = 0
    pin_memory: bool | None = None
    data_timeout_s: float = 600.0
    collect_stats: bool = False
    flush_denormal: bool = True
    gpu_dry_run: bool = False


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
    #: where the round's task ran: (device, the GPU addresses Spark assigned to it, executor)
    placement: tuple[str, tuple[str, ...], str] | None = None


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
    per_round = spec.averaging_frequency * spec.accumulate_steps  # f optimizer steps of k minibatches each
    it = iter(items)
    chunk = list(islice(it, rnd.round * per_round, (rnd.round + 1) * per_round))  # paths or serialized batches
    for _ in it:  # read to the end: a Python worker that leaves input unread is not reused (and would rebuild)
        pass
    if not chunk:  # this worker's data ran out: it joins the round with n = 0
        yield RoundRecord()
        return
    from pyspark import TaskContext

    setup = set_up_task(TaskContext.get(), spec.gpu_dry_run)
    recorder = StatsCollector(worker_id(index), enabled=spec.collect_stats)
    # the task's cores and flush mode before any torch work of it; the reused Python worker gets its own back after
    with task_thread_settings(setup.threads(), spec.flush_denormal):
        record = _fit_round(spec, rnd, index, chunk, setup.device, recorder)
    record.workers[index].placement = (setup.device, setup.gpu_addresses, executor_name())
    yield record


def _fit_round(spec: FitSpec, rnd: RoundInput, index: int, chunk: list[Any], device: str,
               recorder: StatsCollector) -> RoundRecord:
    """Step 4 of the module docstring on this partition: set the round's state, fit ``chunk``, weigh the result."""
    with _NETWORKS.lease(f"{spec.fit_id}/{device}", 1, partial(_build, spec, device, recorder)) as net:
        return _fit_leased(net, spec, rnd, index, chunk, recorder)


def _fit_leased(net: Network, spec: FitSpec, rnd: RoundInput, index: int, chunk: list[Any],
                recorder: StatsCollector) -> RoundRecord:
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
    done = _fit_chunk(net, chunk, spec, validate_first=(rnd.epoch == 0 and rnd.round == 0), recorder=recorder)
    w = float(done.examples)
    weighted = pack_weighted(net, w, spec.save_updater).cpu()  # (P + S + B,): the all-reduce route's packing
    done.stats = recorder.drain() if spec.collect_stats else None
    int_buffers = ({k: v for k, v in net.buffer_state().items() if not v.is_floating_point()} if index == 0
                   else None)
    return RoundRecord(weighted=weighted, examples=done.examples, score_sum=done.score * w,
                       workers={index: done}, int_buffers=int_buffers)


def _build(spec: FitSpec, device: str, recorder: PhaseRecorder) -> Network:
    with recorder.phase("network_init"):
        return NetworkBlueprint.from_bytes(spec.blueprint).build(device)


def _fit_chunk(net: Network, chunk: Sequence[Any], spec: FitSpec, validate_first: bool,
               recorder: PhaseRecorder) -> WorkerRound:
    """Fit the round's minibatches in order, one optimizer step per ``accumulate_steps`` of them (the first step of
    the fit validates its input)."""
    out = WorkerRound()
    load = batch_loader(spec.pin_memory, str(net.device))
    batches = prefetch(chunk, spec.prefetch, spec.data_timeout_s, transform=load)
    groups = iter(group_batches(batches, spec.accumulate_steps))
    try:
        while True:
            with recorder.phase("data_wait"):
                batch = next(groups, None)
            if batch is None:
                return out
            examples = group_examples(batch)
            with recorder.phase("fit", examples=examples):
                out.score = net.train_group(as_group(batch), validate=validate_first and out.iterations == 0)
            out.examples += examples
            out.iterations += 1
            recorder.record_score(net.iteration, out.score)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # stops the prefetch thread when a step raised


# ------------------------------------------------------------------ driver side
class SparkRoundsRunner:
    """The :class:`~torchspark.training.driver.runner.Runner` of ``averaging_via="spark"``: a driver loop of Spark jobs,
    one per averaging round (the module docstring's steps).

    It keeps the fit's state in the driver's network (``context.network``), which holds the latest average after
    every round: a failed or interrupted fit leaves the last completed round. Progress goes to the listeners from
    the driver (``context.notify``, one update per worker and round; no connection from the executors is needed).
    Returns one :class:`WorkerResult` per worker with its totals, its own last minibatch loss and, with stats, its
    per-round payloads; rank 0 carries the final parameters.

    Args:
        sc: the SparkContext.
        aggregation_depth: ``treeAggregate`` depth (the master's ``aggregation_depth``).
        storage_level: persistence of the worker RDD across rounds when it is not cached yet.
        gpus: the training stage's GPUs (:func:`~torchspark.spark.gpus.plan_gpus`): every round's stage runs under
            its stage-level resource profile, if any. None: the session's defaults.
    """

    def __init__(self, sc: Any, aggregation_depth: int = 2, storage_level: str = "MEMORY_ONLY",
                 gpus: GpuPlan | None = None) -> None:
        self.sc = sc
        self.aggregation_depth = aggregation_depth
        self.storage_level = storage_level
        self.gpus = gpus or GpuPlan()

    def run(self, task: WorkerTask, data: Any, context: RunContext) -> list[WorkerResult]:
        """Train ``context.network`` in place for ``task.epochs`` epochs on ``data`` (a
        :class:`~torchspark.spark.runners.SparkWorkerData`: one partition per worker, its minibatches in order).

        Raises:
            ConfigError: the task is not parameter averaging (only averaging has rounds).
            WorkerError: a task failed; the message carries the end of its Python traceback.
        """
        if task.mode != "averaging":
            raise ConfigError(f"averaging_via='spark' runs parameter averaging in rounds; the task's algorithm is "
                              f"{task.mode!r} (use SharedTrainingMaster without averaging_via, or "
                              "ParameterAveragingTrainingMaster)")
        settings = AveragingSettings(**task.settings)
        sc, network, rec = self.sc, context.network, context.recorder
        worker_rdd = data.rdd
        n = worker_rdd.getNumPartitions()
        owned = not worker_rdd.is_cached
        if owned:  # every round re-reads the partitions: keep their content and order fixed for the whole fit
            worker_rdd = worker_rdd.persist(storage_level_by_name(self.storage_level))
        tally = Tally(n)
        spec_bc: Any = None
        try:
            # 1. minibatches per worker, hence rounds per epoch
            with rec.phase("count"):
                counts = run_job(sc, f"torchspark: count the minibatches of {n} workers",
                                 partial(_count_all, worker_rdd, n), "torchspark-round-job")
            rounds = math.ceil(max(counts) / (settings.averaging_frequency * task.accumulate_steps))
            # 2. the network, once per fit (the driver timed building the blueprint as its broadcast phase)
            spec_bc = sc.broadcast(FitSpec(
                fit_id=uuid.uuid4().hex, blueprint=task.blueprint, averaging_frequency=settings.averaging_frequency,
                accumulate_steps=task.accumulate_steps,
                save_updater=settings.save_updater, prefetch=task.prefetch, pin_memory=task.pin_memory,
                data_timeout_s=task.data_timeout_s, collect_stats=task.collect_stats,
                flush_denormal=task.flush_denormal, gpu_dry_run=self.gpus.dry_run))
            checkpoints = RoundsCheckpoints(task, n, rounds)  # a resumed fit: its state, epoch and round
            first_epoch, first_round = checkpoints.start(network, tally)
            for epoch in range(first_epoch, task.epochs):
                start = first_round if epoch == first_epoch else 0
                if not start:
                    tally.start_epoch()
                for r in range(start, rounds):
                    record = self._round(network, worker_rdd, spec_bc, settings, epoch, r, rounds, rec)
                    with rec.phase("aggregation"):
                        round_score = _apply_average(network, record, settings.save_updater)
                    log.debug("epoch %d, round %d/%d: example-weighted score %.6f", epoch, r + 1, rounds,
                              round_score)
                    for update in tally.add(record, epoch):
                        context.notify(update)
                    if r + 1 < rounds:
                        checkpoints.round_end(network, epoch, r + 1, tally, rec)
                network.epoch += 1
                checkpoints.epoch_end(network, epoch + 1, epoch + 1 == task.epochs, tally, rec)
        finally:
            if spec_bc is not None:
                destroy_broadcast(spec_bc)
            if owned:
                worker_rdd.unpersist()
        return tally.results(network)

    def _round(self, network: Network, worker_rdd: Any, spec_bc: Any, settings: AveragingSettings, epoch: int,
               r: int, rounds: int, rec: PhaseRecorder) -> RoundRecord:
        # 3. the state the round starts from (the fit's first round also carries the driver's updater state, which
        # the torch route's workers get from the blueprint)
        with rec.phase("broadcast"):
            send_state = settings.save_updater or (epoch == 0 and r == 0)
            round_bc = self.sc.broadcast(RoundInput(epoch, r, network.iteration, network.params().cpu(),
                                                    network.updater_state().cpu() if send_state else None,
                                                    network.buffers().cpu(), _int_buffers(network)))
        # 4. one job: every partition fits from it, treeAggregate sums the records
        try:
            with rec.phase("fit"):
                return run_job(self.sc, f"torchspark averaging: epoch {epoch + 1}, round {r + 1}/{rounds}",
                               partial(_fit_and_sum, worker_rdd, spec_bc, round_bc, self.aggregation_depth,
                                       self.gpus),
                               "torchspark-round-job")
        finally:
            destroy_broadcast(round_bc)


def _count_all(worker_rdd: Any, n: int) -> list[int]:
    counts = [0] * n
    for index, count in worker_rdd.mapPartitionsWithIndex(count_items).collect():
        counts[index] = count
    return counts


def _fit_and_sum(worker_rdd: Any, spec_bc: Any, round_bc: Any, depth: int, gpus: GpuPlan) -> RoundRecord:
    fit = partial(fit_round_partition, spec_bc, round_bc)
    fitted = with_training_resources(worker_rdd.mapPartitionsWithIndex(fit), gpus)
    return fitted.treeAggregate(RoundRecord(), merge_records, merge_records, depth)


def _apply_average(network: Network, record: RoundRecord, save_updater: bool) -> float:
    """Step 5: the example-weighted mean into the driver's network; returns the round's weighted score."""
    if record.weighted is None or record.examples == 0:  # cannot happen: every round has a worker with data
        raise TorchSparkError("an averaging round fitted no examples; please report this as a bug")
    apply_weighted_mean(network, record.weighted, float(record.examples), save_updater)
    if record.int_buffers:
        network.load_buffer_state(record.int_buffers)
    network.iteration += max(w.iterations for w in record.workers.values())
    return record.score_sum / record.examples


def _int_buffers(network: Network) -> dict[str, torch.Tensor]:
    return {k: v for k, v in network.buffer_state().items() if not v.is_floating_point()}
