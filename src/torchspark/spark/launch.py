"""The Spark stage of [`torchspark.launch.run`][torchspark.launch.run]: one barrier ``mapInArrow`` stage, the same
shape on a classic session and on Spark Connect (as `ConnectBarrierRunner` runs a fit), whose tasks run the user's
function as the ranks of a ``torch.distributed`` world.

Each task: takes its device and cores (`set_up_task`: the GPU Spark assigned to it, if any); spools its
partition of ``data`` to its own disk (`torchspark.ranks.shares`); learns rank 0's address through Spark's
``allGather`` (rank 0 offers a free port on the address `choose_endpoint` picks, with
``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` set as for the masters' workers: `socket_interface`); runs the
function through [`run_rank`][torchspark.ranks.run_rank]; rank 0 then returns its value as `PAYLOAD_SCHEMA` rows
of at most 1 MiB each, which the driver unpickles straight from the Arrow column (`load_result`).

The driver checks the free task slots before the stage (`check_slots`: classic `task_slots` of the stage's
resource profile, Connect `connect_preflight`), runs it under a job group (classic, `run_job`) or a tag
(Connect, `run_tagged`) with the fit's watchdog, and maps a failed task as the masters do: the rank's own
error ([`WorkerError`][torchspark.errors.WorkerError], never retried) or a lost worker
([`WorkerLost`][torchspark.errors.WorkerLost], which ``max_failures`` retries as a new stage).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torchspark.errors import ConfigError, SetupError, WorkerError
from torchspark.ranks.body import RankSpec, load_result, result_parts, run_rank, unship_function
from torchspark.ranks.shares import DataShare, spool
from torchspark.spark.barrier_wait import wait_bounded
from torchspark.spark.connect.chunks import PAYLOAD_SCHEMA
from torchspark.spark.connect.jobs import client_is_local, connect_preflight, run_tagged
from torchspark.spark.driver_address import driver_listen_address
from torchspark.spark.gpus import TASK_GPUS, GpuPlan, dry_run_requested, plan_gpus
from torchspark.spark.jobs import run_job
from torchspark.spark.preflight import preflight, task_slots
from torchspark.spark.session_kinds import is_connect_session
from torchspark.spark.task_bootstrap import set_up_task
from torchspark.training.rendezvous.netif import choose_endpoint, socket_interface

__all__ = ["SparkLauncher", "rank_stage", "active_session", "is_spark_frame"]

log = logging.getLogger(__name__)


def active_session() -> Any:
    """The active Spark session (classic or Connect), or None."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def is_spark_frame(obj: Any) -> bool:
    """Whether ``obj`` is a Spark DataFrame (classic or Connect)."""
    try:
        from pyspark.sql import DataFrame
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return False
    if isinstance(obj, DataFrame):
        return True
    try:
        from pyspark.sql.connect.dataframe import DataFrame as ConnectFrame
    except ImportError:
        return False
    return isinstance(obj, ConnectFrame)


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _result_batch(rank: int, part: int, payload: bytes) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [
            pa.array([rank], pa.int64()),
            pa.array(["result"], pa.string()),
            pa.array([part], pa.int64()),
            pa.array([-1], pa.int64()),
            pa.array([payload], pa.binary()),
        ],
        names=["rank", "kind", "part", "parts", "payload"],
    )


def rank_stage(
    blob: bytes,
    attempt: int,
    run_id: str,
    checkpoint_dir: str | None,
    seed: int,
    timeout_s: float,
    progress: Any,
    has_data: bool,
    gpu_dry_run: bool = False,
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of the stage (the module docstring): ``blob`` is `ship_function`'s bytes."""

    def run(batches: Iterable[Any]) -> Iterator[Any]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        setup = set_up_task(ctx, gpu_dry_run)
        rank = int(ctx.partitionId())
        infos = ctx.getTaskInfos()
        world = len(infos)
        scratch = tempfile.mkdtemp(prefix=f"torchspark-run-{rank}-")
        try:
            share: DataShare | None = None
            if has_data:
                share = spool(batches, os.path.join(scratch, "share.arrow"))
            else:
                for _ in batches:
                    pass
            me = choose_endpoint(None, infos[rank].address.rsplit(":", 1)[0])
            offer = f"{me.address}:{_free_port(me.address)}" if rank == 0 else ""
            gathered = wait_bounded(
                lambda: ctx.allGather(offer), timeout_s, f"rank {rank} of {world} in Spark's barrier allGather"
            )
            host, port = str(gathered[0]).rsplit(":", 1)
            device = setup.device
            spec = RankSpec(
                rank=rank,
                world_size=world,
                master_addr=host,
                master_port=int(port),
                local_rank=int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0,
                device=device,
                backend="nccl" if device.startswith("cuda") else "gloo",
                attempt=attempt,
                run_id=run_id,
                checkpoint_dir=checkpoint_dir,
                seed=seed,
            )
            fn, args, kwargs = unship_function(blob)
            import torch

            torch.set_num_threads(setup.cpus)
            with socket_interface(me.interface):
                value = run_rank(spec, fn, args, kwargs, progress, share)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if rank == 0:
            for part, payload in enumerate(result_parts(value)):
                yield _result_batch(rank, part, payload)

    return run


def _rank0_parts(table: Any) -> Iterator[bytes]:
    """Rank 0's result parts in order, read one at a time from the stage's Arrow table."""
    ranks = table.column("rank").to_pylist()
    parts = table.column("part").to_pylist()
    rows = sorted((p, i) for i, (r, p) in enumerate(zip(ranks, parts)) if r == 0)
    if [p for p, _ in rows] != list(range(len(rows))) or not rows:
        raise WorkerError(f"rank 0's result arrived with parts {[p for p, _ in rows][:20]}: the stage lost rows")
    payload = table.column("payload")
    for _, i in rows:
        yield payload[i].as_py()


class SparkLauncher:
    """Runs the ranks of `torchspark.launch.run` as one barrier stage of ``spark`` (classic or Connect).

    Args:
        spark: the ``SparkSession``.
        use_gpu: a GPU per rank through Spark's resource scheduling: the session's
            ``spark.task.resource.gpu.amount``, else (classic, not local mode) a stage-level profile of one GPU per
            task (`plan_gpus`).
        data: the DataFrame the ranks share (repartitioned to one partition per rank), or None.
    """

    def __init__(self, spark: Any, use_gpu: bool = False, data: Any = None) -> None:
        self.spark = spark
        self.connect = is_connect_session(spark)
        self.data = data
        self.gpus = GpuPlan()
        if use_gpu:
            self.gpus = self._plan_gpus()

    def _plan_gpus(self) -> GpuPlan:
        if self.connect:
            amount = float(self.spark.conf.get(TASK_GPUS, "0") or 0)
            if amount <= 0:
                raise SetupError(
                    f"use_gpu=True on a Spark Connect session whose tasks get no GPU ({TASK_GPUS} is unset); start "
                    f"the server with {TASK_GPUS}=1 and a GPU discovery script, or pass use_gpu=False"
                )
            return GpuPlan(dry_run=dry_run_requested())
        sc = self.spark.sparkContext
        session = float(sc.getConf().get(TASK_GPUS, "0") or 0)
        plan = plan_gpus(sc, None if session > 0 else 1, dry_run_requested())
        if not plan.requested:  # pragma: no cover - plan_gpus raises first
            raise SetupError(f"use_gpu=True but the session gives tasks no GPU; set {TASK_GPUS}=1")
        return plan

    def check_slots(self, workers: int) -> None:
        """Fail before the stage when the cluster has fewer free task slots than ``workers`` (or dynamic
        allocation is on), naming the fix.

        Raises:
            SetupError: as `too_few_slots`.
        """
        if self.connect:
            connect_preflight(self.spark, workers)
            return
        # the masters' preflight: dynamic allocation off, executors of a fresh cluster waited for, the slots of
        # the stage's resource profile counted, and with GPUs the executors' CUDA checked
        preflight(self.spark.sparkContext, workers, check_imports=False, gpus=self.gpus)

    def capacity(self) -> int:
        """Task slots free for the stage now (what a smaller relaunch can use)."""
        if self.connect:
            from torchspark.spark.connect.jobs import default_parallelism

            return default_parallelism(self.spark)
        return task_slots(self.spark.sparkContext, self.gpus.profile)

    def _progress(self, context: Any) -> Any:
        if self.connect:
            if not client_is_local(self.spark):
                return None  # executors cannot dial this client; the run still goes, without live progress
            return context.progress_address()
        bind, host = driver_listen_address(self.spark.sparkContext)
        return context.progress_address(host=bind, advertise_host=host)

    def launch(
        self,
        blob: bytes,
        workers: int,
        *,
        attempt: int,
        run_id: str,
        checkpoint_dir: str | None,
        seed: int,
        timeout_s: float,
        context: Any,
    ) -> Any:
        """Run one attempt: rank 0's return value.

        Raises:
            WorkerError: a rank's own error (its traceback), or
            WorkerLost: a rank's process or executor was lost, or a rank hung (the watchdog).
        """
        if self.data is not None:
            frame = self.data.repartition(workers)
        else:
            frame = self.spark.range(0, workers, 1, workers)
        progress = self._progress(context)
        fn = rank_stage(
            blob,
            attempt,
            run_id,
            checkpoint_dir,
            seed,
            timeout_s,
            progress,
            self.data is not None,
            self.gpus.dry_run,
        )

        def stage() -> Any:
            if self.gpus.profile is not None:
                mapped = frame.mapInArrow(fn, PAYLOAD_SCHEMA, barrier=True, profile=self.gpus.profile)
            else:
                mapped = frame.mapInArrow(fn, PAYLOAD_SCHEMA, barrier=True)
            return mapped.toArrow()

        def watchdog() -> BaseException | None:
            return context.stalled(workers, timeout_s)

        with context.recorder.phase("fit"):
            if self.connect:
                table = run_tagged(
                    self.spark,
                    context.description,
                    stage,
                    reported_errors=context.reported_errors,
                    watchdog=watchdog,
                )
            else:
                table = run_job(
                    self.spark.sparkContext,
                    context.description,
                    stage,
                    "torchspark-run-stage",
                    context.reported_errors,
                    watchdog,
                )
        return load_result(_rank0_parts(table))


def check_data(data: Any) -> None:
    """Refuse ``data`` the Spark route cannot share out.

    Raises:
        ConfigError: not a Spark DataFrame.
    """
    if data is not None and not is_spark_frame(data):
        raise ConfigError(
            f"run(data=...) on Spark takes a Spark DataFrame, got a {type(data).__name__}; create one with "
            "spark.createDataFrame(...) or read it with spark.read"
        )
