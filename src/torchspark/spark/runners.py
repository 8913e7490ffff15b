"""The Spark runners of `torchspark.training.driver.fit.run_fit`, and the workers' data as ``SparkNetwork``
prepares it.

* `SparkBarrierRunner`: the whole fit inside one barrier stage whose tasks find each other
  (`torchspark.spark.barrier`) and all-reduce or share gradients over ``torch.distributed``;
* `SparkRoundsRunner`: one Spark job per averaging round (``averaging_via="spark"``).

Both take a `SparkWorkerData`; so does [`InProcessRunner`][torchspark.training.InProcessRunner], which
reads the partitions on the driver and trains them in threads (tests: ``SparkNetwork(..., runner=InProcessRunner())``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from torchspark.spark.barrier import barrier_task, open_relay
from torchspark.spark.broadcasts import destroy_broadcast
from torchspark.spark.driver_address import driver_listen_address
from torchspark.spark.gpus import GpuPlan
from torchspark.spark.jobs import run_barrier_stage, run_job
from torchspark.spark.preflight import task_slots
from torchspark.spark.rounds import SparkRoundsRunner
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.config.mesh import MeshConfig
from torchspark.training.driver.runner import RunContext
from torchspark.training.rendezvous.auth import new_token
from torchspark.training.rendezvous.relay import RelayServer
from torchspark.training.task import EpochSource, WorkerResult, WorkerTask
from torchspark.training.worker.loop import ItemSource

__all__ = ["SparkWorkerData", "SparkBarrierRunner", "SparkRoundsRunner", "elastic_route"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SparkWorkerData:
    """An RDD with one partition per worker holding that worker's minibatch items in order (batch-file paths,
    file slices or serialized batches)."""

    sc: Any
    rdd: Any

    @property
    def workers(self) -> int:
        return int(self.rdd.getNumPartitions())

    def local_sources(self) -> list[EpochSource]:
        """Every partition's items, read on the driver (for in-process runs of small data)."""

        def read(index: int) -> list[Any]:
            return run_job(
                self.sc,
                f"torchspark: read worker {index}'s minibatches",
                lambda: self.sc.runJob(self.rdd, list, partitions=[index]),
            )

        return [ItemSource(read(i)) for i in range(self.workers)]


class SparkBarrierRunner:
    """Run the fit as one Spark barrier stage: one task per worker, all started together.

    The task travels as a broadcast; the workers stream progress, errors and stats to the driver's progress server
    (bound to ``spark.driver.bindAddress`` / ``spark.driver.host``, loopback for a local master; advertised as
    ``spark.driver.host``; workers get the fit's token inside the task) and find worker 0 through the driver's relay
    store (``rendezvous_via="driver"``) or Spark's allGather. A failed stage raises the failing worker's own error
    (`run_barrier_stage`), not a peer's symptom; a lost Python worker or executor,
    or a worker whose heartbeats stop for ``rendezvous_timeout_s`` (the driver's watchdog cancels the stage then,
    without waiting for Spark's 120 s executor heartbeat timeout), raises [`WorkerLost`][torchspark.errors.WorkerLost],
    which the driver's recovery retries as a new attempt (a new stage, relay and progress token).

    Args:
        sc: the SparkContext.
        mesh: how workers find and talk to each other (the master's ``mesh``).
        gpus: the training stage's GPUs (`plan_gpus`): its stage-level resource
            profile, if any, is attached to the barrier stage. None: the session's defaults.
    """

    def __init__(self, sc: Any, mesh: MeshConfig, gpus: GpuPlan | None = None) -> None:
        self.sc = sc
        self.mesh = mesh
        self.gpus = gpus or GpuPlan()

    def capacity(self) -> int:
        """The task slots the training stage can have now (an executor lost for good no longer counts): how many
        workers an elastic fit's next attempt can run ([`torchspark.training.driver.elastic`][torchspark.training.driver.elastic])."""
        return task_slots(self.sc, self.gpus.profile)

    def run(self, task: WorkerTask, data: SparkWorkerData, context: RunContext) -> list[WorkerResult]:
        bind, host = driver_listen_address(self.sc)
        task_bc = self.sc.broadcast(task)
        relay: RelayServer | None = None
        try:
            progress = context.progress_address(host=bind, advertise_host=host, port_range=self.mesh.port_range)
            relay_address = None
            token = progress.token if progress is not None else new_token()
            if self.mesh.rendezvous_via == "driver":
                relay, relay_address = open_relay(
                    host, self.mesh.rendezvous_timeout_s, self.mesh.port_range, bind_host=bind, token=token
                )
            fn = barrier_task(task_bc, self.mesh, progress, relay_address, token, gpu_dry_run=self.gpus.dry_run)
            world, timeout_s = data.workers, self.mesh.rendezvous_timeout_s
            with context.recorder.phase("fit"):
                return run_barrier_stage(
                    self.sc,
                    data.rdd,
                    fn,
                    context.description,
                    reported_errors=context.reported_errors,
                    watchdog=lambda: context.stalled(world, timeout_s),
                    profile=self.gpus.profile,
                )
        finally:
            if relay is not None:
                relay.close()  # returns within its timeout whatever a client holds open
            destroy_broadcast(task_bc)  # not only unpersist: the driver would keep each attempt's weights


def elastic_route(data: SparkWorkerData, master: TrainingMaster) -> Callable[[int], SparkWorkerData] | None:
    """How an elastic fit (the master's ``min_workers``) re-deals ``data`` on Spark: ``data_for(n)`` regroups the
    worker partitions into ``n`` (each new worker trains the minibatches of the old workers it takes
    over, in their order; one shuffle, since a barrier stage cannot read a coalesced RDD); ``n`` equal to the fit's
    workers gives ``data`` back.

    None where the data cannot be re-dealt: the rounds route (``averaging_via="spark"``) and
    ``shuffle_scope="global"`` (the partitions hold every epoch's plan for their worker); a fit with ``min_workers``
    below its workers is then refused (`elastic_plan`).
    """
    if master.spark_rounds or master.shuffle_scope == "global":
        return None
    full = data.workers

    def data_for(n: int) -> SparkWorkerData:
        if n >= full:
            return data
        keyed = data.rdd.mapPartitionsWithIndex(partial(_keyed_for, n))
        return SparkWorkerData(data.sc, keyed.repartitionAndSortWithinPartitions(n, partitionFunc=_new_worker).values())

    return data_for


def _keyed_for(n: int, index: int, items: Any) -> Any:
    """Old worker ``index``'s items keyed ``(new worker, old worker, position)``: old worker ``j`` goes to new
    worker ``j % n``, behind the old workers before it, in its own order."""
    for position, item in enumerate(items):
        yield (index % n, index, position), item


def _new_worker(key: tuple[int, int, int]) -> int:
    return key[0]
