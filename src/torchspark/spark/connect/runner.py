"""The Spark Connect runner of `torchspark.training.driver.fit.run_fit`: the whole fit as one barrier
``mapInArrow`` stage over the workers' DataFrame, with everything a classic fit gets from a SparkContext replaced.

=========================  ===============================  ==============================================
what                       classic (``SparkBarrierRunner``)  Connect (`ConnectBarrierRunner`)
=========================  ===============================  ==============================================
the stage                  ``rdd.barrier().mapPartitions``   ``frame.mapInArrow(fn, schema, barrier=True)``
the task and weights       ``sc.broadcast``                  the closure, or session artifacts when large
                                                             (`shipping`)
rendezvous                 the driver's relay store          ``BarrierTaskContext.allGather`` (executors
                                                             never connect to the client)
results                    pickled ``collect()``             output rows, safetensors + JSON, chunked
                                                             (`results`)
cancelling                 job groups                        tags (`run_tagged`)
progress, worker errors    the driver's progress server      the same when the server is on this machine
                                                             (`client_is_local`);
                                                             else files in a directory the client polls
                                                             (`progress`)
=========================  ===============================  ==============================================

A worker that raises fails the stage, so Spark stops its peers at once (a task that returned its error as a row
would leave them blocked in a collective until ``rendezvous_timeout_s``); the client reads the worker's own
traceback out of Spark's error (`task_error`), preferring what the worker reported
over the progress channel when a peer's symptom came first. A lost Python worker or executor raises
[`WorkerLost`][torchspark.errors.WorkerLost], which the driver's recovery retries as a new stage.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

from torchspark.errors import WorkerError
from torchspark.spark.barrier import rendezvous
from torchspark.spark.connect.chunks import PAYLOAD_SCHEMA, gather_payloads, payload_batches
from torchspark.spark.connect.feeding import ConnectWorkerData
from torchspark.spark.connect.jobs import client_is_local, connect_preflight, run_tagged
from torchspark.spark.connect.progress import ConnectProgress, choose_channel, open_channel, progress_base
from torchspark.spark.connect.results import decode_result, encode_result
from torchspark.spark.connect.shipping import Shipment, ship_bytes
from torchspark.spark.driver_address import driver_listen_address
from torchspark.spark.session_kinds import is_connect_session
from torchspark.spark.task_bootstrap import executor_name, set_up_task
from torchspark.training.comm import TorchDistCommunicator
from torchspark.training.config.mesh import MeshConfig
from torchspark.training.driver.runner import RunContext
from torchspark.training.progress import ProgressDirectory, ProgressEndpoint
from torchspark.training.task import WorkerResult, WorkerTask
from torchspark.training.worker.loop import ItemSource, run_worker
from torchspark.training.worker.reporting import open_worker_hooks

__all__ = ["ConnectBarrierRunner", "connect_barrier_task"]

log = logging.getLogger(__name__)

# the runner's older ``progress`` flag as a channel
_FROM_PROGRESS = {None: "auto", True: "tcp", False: "none"}


def connect_barrier_task(
    task: WorkerTask,
    blueprint: Shipment,
    mesh: MeshConfig,
    feed: Callable[[int, Iterable[Any]], Iterable[Any]],
    progress: ProgressEndpoint | ProgressDirectory | None = None,
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of the training stage: set up the task (device, cores), read the weights, meet
    the peers through ``allGather``, train on ``feed(rank, record_batches)``, return the
    [`WorkerResult`][torchspark.training.WorkerResult] as `PAYLOAD_SCHEMA` rows.

    Args:
        task: the worker task without its blueprint (``blueprint=b""``: it travels in ``blueprint``).
        blueprint: the network's blueprint bytes, shipped (`ship_bytes`).
        mesh: the master's mesh settings (timeouts, ports, network mask); workers always meet through Spark's
            ``allGather``, whatever ``rendezvous_via`` says.
        feed: turns the partition's Arrow batches into the worker's minibatch items.
        progress: the client's progress server when the executors can reach it, the progress directory the client
            polls, or None.
    """

    def run(batches: Iterable[Any]) -> Iterator[Any]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        setup = set_up_task(ctx)
        rank = ctx.partitionId()
        hooks = open_worker_hooks(rank, task.collect_stats, progress, report_scores=task.report_scores)
        comm: TorchDistCommunicator | None = None
        try:
            worker_task = replace(task, blueprint=blueprint.read(), num_threads=setup.threads(task.num_threads))
            comm, chosen = rendezvous(ctx, mesh, setup.device, attempt=task.attempt)
            result = run_worker(worker_task, ItemSource(feed(rank, batches)), comm, setup.device, hooks)
            payload = encode_result(
                replace(
                    result,
                    network=chosen,
                    device=setup.device,
                    gpu_addresses=setup.gpu_addresses,
                    executor=executor_name(),
                )
            )
        except BaseException:
            if hooks.report_error is not None:
                hooks.report_error(traceback.format_exc())
            raise
        finally:
            if comm is not None:
                comm.close()
            if hooks.close is not None:
                hooks.close()
        yield from payload_batches(rank, "result", payload)

    return run


class ConnectBarrierRunner:
    """Run the fit as one barrier ``mapInArrow`` stage of a Spark Connect session (the table in the module
    docstring).

    Args:
        spark: the Connect session.
        mesh: the master's mesh settings.
        progress: the TCP channel only: None (default) decides as ``channel="auto"``, True forces ``"tcp"`` (a
            server on this machine addressed by a name that is not loopback), False is ``"none"``. Ignored when
            ``channel`` is given.
        inline_limit: the largest blueprint sent inside the task's closure (None: a quarter of the server's
            ``spark.connect.grpc.maxInboundMessageSize``; 0: always as session artifacts).
        channel: how progress, heartbeats, scores and tracebacks reach this client
            (`ConnectProgress`: TCP, a polled directory, or none).
    """

    def __init__(
        self,
        spark: Any,
        mesh: MeshConfig,
        progress: bool | None = None,
        inline_limit: int | None = None,
        channel: ConnectProgress | None = None,
    ) -> None:
        self.spark = spark
        self.mesh = mesh
        self.progress = progress
        self.inline_limit = inline_limit
        self.channel = channel if channel is not None else ConnectProgress(_FROM_PROGRESS[progress])

    def run(self, task: WorkerTask, data: ConnectWorkerData, context: RunContext) -> list[WorkerResult]:
        if is_connect_session(self.spark):
            connect_preflight(self.spark, data.workers)  # too many workers fails now, not after ~10 min of re-checks
            base = progress_base(self.channel, task.checkpoint)
            local = self.channel.channel == "auto" and client_is_local(self.spark)
            kind = choose_channel(self.channel, local, base)
            address = open_channel(kind, self.channel, base, context, self.mesh.port_range)
        else:
            address = self._classic_progress(context)
        shipped = ship_bytes(self.spark, task.blueprint, "weights", self.inline_limit)
        fn = connect_barrier_task(replace(task, blueprint=b""), shipped, self.mesh, data.feed, address)
        world, timeout_s = data.workers, self.mesh.rendezvous_timeout_s
        with context.recorder.phase("fit"):
            table = run_tagged(
                self.spark,
                context.description,
                lambda: data.frame.mapInArrow(fn, PAYLOAD_SCHEMA, barrier=True).toArrow(),
                reported_errors=context.reported_errors,
                watchdog=lambda: context.stalled(world, timeout_s),
            )
        payloads = gather_payloads(table)
        missing = [r for r in range(world) if (r, "result") not in payloads]
        if missing:
            raise WorkerError(f"{context.description}: no result rows from worker(s) {missing}")
        return [decode_result(payloads[(r, "result")]) for r in range(world)]

    def _classic_progress(self, context: RunContext) -> ProgressEndpoint | None:
        """The progress channel's address on a classic session (``dataframe_route="barrier_arrow"``): where the
        classic barrier runner opens it (the executors reach the driver)."""
        if self.channel.channel == "none":
            return None
        bind, host = driver_listen_address(self.spark.sparkContext)
        return context.progress_address(host=bind, advertise_host=host, port_range=self.mesh.port_range)
