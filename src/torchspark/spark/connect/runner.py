"""The Spark Connect runner of `torchspark.training.driver.fit.run_fit`: the whole fit as one barrier
``mapInArrow`` stage over the workers' DataFrame, with everything a classic fit gets from a SparkContext replaced.

How it differs from the classic barrier runner (the stage, the task and weights, rendezvous, results, cancelling,
progress): the table in docs/design.md, "Where a worker runs"; both tasks run the one worker body
(`torchspark.training.worker.body.worker_main`).

A worker that raises fails the stage, so Spark stops its peers at once (a task that returned its error as a row
would leave them blocked in a collective until ``rendezvous_timeout_s``); the client reads the worker's own
traceback out of Spark's error (`task_error`), preferring what the worker reported
over the progress channel when a peer's symptom came first. A lost Python worker or executor raises
[`WorkerLost`][torchspark.errors.WorkerLost], which the driver's recovery retries as a new stage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, cast

from torchspark.errors import WorkerError
from torchspark.spark.barrier import barrier_env
from torchspark.spark.connect.chunks import PAYLOAD_SCHEMA, gather_payloads, payload_batches
from torchspark.spark.connect.feeding import ConnectWorkerData
from torchspark.spark.connect.jobs import client_is_local, connect_preflight, run_tagged
from torchspark.spark.connect.progress import ConnectProgress, choose_channel, open_channel, progress_base
from torchspark.spark.connect.results import decode_result, encode_result
from torchspark.spark.connect.shipping import Shipment, ship_bytes
from torchspark.spark.driver_address import driver_listen_address
from torchspark.spark.session_kinds import is_connect_session
from torchspark.training.config.mesh import MeshConfig
from torchspark.training.driver.runner import RunContext
from torchspark.training.progress import ProgressDirectory, ProgressEndpoint
from torchspark.training.task import WorkerResult, WorkerTask
from torchspark.training.worker.body import RankSetup, train, worker_main
from torchspark.training.worker.loop import ItemSource

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
        rank = ctx.partitionId()
        env = barrier_env(ctx, task, mesh, progress)

        def work(setup: RankSetup) -> bytes:  # the blueprint is read (and the result encoded) inside the body
            return encode_result(
                train(replace(task, blueprint=blueprint.read()), ItemSource(feed(rank, batches)))(setup)
            )

        yield from payload_batches(rank, "result", cast(bytes, worker_main(env, work)))

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
