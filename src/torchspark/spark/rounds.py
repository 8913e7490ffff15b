"""Parameter averaging with one Spark job per round (``averaging_via="spark"``): DL4J's original route.

Unlike the default route (one barrier stage whose tasks all-reduce over ``torch.distributed``, so executors must
reach each other on a port), this route needs nothing but Spark: per round the driver broadcasts the parameters,
every task trains from them and returns one record, ``treeAggregate`` sums the records and the driver averages.
It pays one Spark job and one broadcast per round (tens to hundreds of milliseconds each), but works wherever Spark
jobs work, and Spark may simply retry a failed task (a round reads only broadcasts and its own data).

Per fit (driver, `SparkRoundsRunner`, run by `torchspark.training.driver.fit.run_fit`):
  1. count the minibatches of every worker partition (one small job); rounds per epoch = ceil(max count / (f * k))
     (``k`` = ``accumulate_steps``);
  2. broadcast the fit's task once (each Python worker builds the network once per fit: `NetworkCache`).
Per round ``r`` of every epoch (the rounds and arithmetic of
[`torchspark.training.algorithms.averaging.averaging_epoch`][torchspark.training.averaging_epoch]):
  3. broadcast the current parameters and buffers (averaged floating-point ones, worker 0's integer ones), plus the
     updater state when ``save_updater`` (and in the fit's first round);
  4. one job: each partition sets them (resetting the updater when no state came), fits its minibatches
     ``[r*f*k, (r+1)*f*k)`` with the averaging loop's `train_round` and yields one `RoundRecord`
     ``(params*n | updater_state*n | buffers*n, n, score*n)`` (`pack_weighted`; ``n = 0`` when its data ran out);
     ``treeAggregate(depth=aggregation_depth)`` sums them;
  5. the driver applies `apply_weighted_mean` (the all-reduce route's rule), takes partition 0's integer buffers
     and advances ``iteration`` by the round's most optimizer steps on one worker.
A failed or interrupted fit leaves the driver's network at the last completed round; with a
``checkpoint_directory`` the driver checkpoints it (`torchspark.spark.rounds_state`), so a retry or a later fit
with the same ``run_id`` resumes from the newest checkpoint.

Progress listeners get one [`ProgressUpdate`][torchspark.training.ProgressUpdate] per worker and round from the
driver. ``last_results`` holds one [`WorkerResult`][torchspark.training.WorkerResult] per worker (totals, its own
last minibatch loss; rank 0 the final parameters). With ``collect_training_stats`` the workers' phases travel in
the round records, timed on the executors' own clocks. The executor side is `torchspark.spark.rounds_worker`.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from torchspark.errors import ConfigError, TorchSparkError, WorkerLost
from torchspark.nn import Network
from torchspark.spark.broadcasts import destroy_broadcast
from torchspark.spark.data import storage_level_by_name
from torchspark.spark.gpus import GpuPlan, with_training_resources
from torchspark.spark.jobs import run_job
from torchspark.spark.rounds_state import RoundsCheckpoints, Tally
from torchspark.spark.rounds_worker import (
    FitSpec,
    RoundInput,
    RoundRecord,
    WorkerRound,
    count_items,
    fit_round_partition,
    integer_buffers,
    merge_records,
)
from torchspark.training.algorithms.averaging import AveragingSettings, apply_weighted_mean
from torchspark.training.driver.runner import RunContext
from torchspark.training.driver.stall import round_watch
from torchspark.training.hooks import PhaseRecorder
from torchspark.training.task import WorkerResult, WorkerTask

# the executor side's names are re-exported: what travels is part of this route's documented surface
__all__ = [
    "FitSpec",
    "RoundInput",
    "RoundRecord",
    "WorkerRound",
    "SparkRoundsRunner",
    "fit_round_partition",
    "merge_records",
]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ driver side
class SparkRoundsRunner:
    """The [`Runner`][torchspark.training.Runner] of ``averaging_via="spark"``: a driver loop of Spark jobs,
    one per averaging round (the module docstring's steps).

    It keeps the fit's state in the driver's network (``context.network``), which holds the latest average after
    every round: a failed or interrupted fit leaves the last completed round. Progress goes to the listeners from
    the driver (``context.notify``, one update per worker and round; no connection from the executors is needed).
    Returns one [`WorkerResult`][torchspark.training.WorkerResult] per worker with its totals, its own last minibatch loss and, with stats, its
    per-round payloads; rank 0 carries the final parameters.

    Args:
        sc: the SparkContext.
        aggregation_depth: ``treeAggregate`` depth (the master's ``aggregation_depth``).
        storage_level: persistence of the worker RDD across rounds when it is not cached yet.
        gpus: the training stage's GPUs (`plan_gpus`): every round's stage runs under
            its stage-level resource profile, if any. None: the session's defaults.
    """

    def __init__(
        self, sc: Any, aggregation_depth: int = 2, storage_level: str = "MEMORY_ONLY", gpus: GpuPlan | None = None
    ) -> None:
        self.sc = sc
        self.aggregation_depth = aggregation_depth
        self.storage_level = storage_level
        self.gpus = gpus or GpuPlan()

    def run(self, task: WorkerTask, data: Any, context: RunContext) -> list[WorkerResult]:
        """Train ``context.network`` in place for ``task.epochs`` epochs on ``data`` (a
        `SparkWorkerData`: one partition per worker, its minibatches in order).

        Raises:
            ConfigError: the task is not parameter averaging (only averaging has rounds).
            WorkerError: a task failed; the message carries the end of its Python traceback.
        """
        if task.mode != "averaging":
            raise ConfigError(
                f"averaging_via='spark' runs parameter averaging in rounds; the task's algorithm is "
                f"{task.mode!r} (use SharedTrainingMaster without averaging_via, or "
                "ParameterAveragingTrainingMaster)"
            )
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
                counts = run_job(
                    sc,
                    f"torchspark: count the minibatches of {n} workers",
                    partial(_count_all, worker_rdd, n),
                    "torchspark-round-job",
                )
            rounds = math.ceil(max(counts) / (settings.averaging_frequency * task.accumulate_steps))
            # 2. the network, once per fit (the driver timed building the blueprint as its broadcast phase)
            spec_bc = sc.broadcast(FitSpec(uuid.uuid4().hex, task, self.gpus.dry_run))
            checkpoints = RoundsCheckpoints(task, n, rounds)  # a resumed fit: its state, epoch and round
            first_epoch, first_round = checkpoints.start(network, tally)
            first = True  # the attempt's first round: it loads the first data and builds the network
            for epoch in range(first_epoch, task.epochs):
                start = first_round if epoch == first_epoch else 0
                if not start:
                    tally.start_epoch()
                for r in range(start, rounds):
                    watch = round_watch(context.stall_timeout_s, first, f"epoch {epoch + 1}, round {r + 1}/{rounds}")
                    first = False
                    record = self._round(network, worker_rdd, spec_bc, settings, epoch, r, rounds, rec, watch)
                    with rec.phase("aggregation"):
                        round_score = _apply_average(network, record, settings.save_updater)
                    log.debug("epoch %d, round %d/%d: example-weighted score %.6f", epoch, r + 1, rounds, round_score)
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

    def _round(
        self,
        network: Network,
        worker_rdd: Any,
        spec_bc: Any,
        settings: AveragingSettings,
        epoch: int,
        r: int,
        rounds: int,
        rec: PhaseRecorder,
        watch: Callable[[], WorkerLost | None] | None = None,
    ) -> RoundRecord:
        # 3. the state the round starts from (the fit's first round also carries the driver's updater state, which
        # the torch route's workers get from the blueprint)
        with rec.phase("broadcast"):
            send_state = settings.save_updater or (epoch == 0 and r == 0)
            round_bc = self.sc.broadcast(
                RoundInput(
                    epoch,
                    r,
                    network.iteration,
                    network.params().cpu(),
                    network.updater_state().cpu() if send_state else None,
                    network.buffers().cpu(),
                    integer_buffers(network),
                )
            )
        # 4. one job: every partition fits from it, treeAggregate sums the records
        try:
            with rec.phase("fit"):
                return run_job(
                    self.sc,
                    f"torchspark averaging: epoch {epoch + 1}, round {r + 1}/{rounds}",
                    partial(_fit_and_sum, worker_rdd, spec_bc, round_bc, self.aggregation_depth, self.gpus),
                    "torchspark-round-job",
                    watchdog=watch,  # stall_timeout_s: a round whose tasks hang is cancelled, not waited on forever
                )
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
