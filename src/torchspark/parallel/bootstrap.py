"""Starting a worker process: the multiprocessing context, what a worker receives, and its entry point.

Workers start from a fork server with torch preloaded (`worker_context`; ``spawn`` where there is none),
never by forking the caller. Each gets a `ChildArgs` and runs `child_main`, the one worker body
(`torchspark.training.worker.body.worker_main`) with this route's rendezvous: it joins the store the parent hosts,
builds its communicator, runs [`run_worker`][torchspark.training.run_worker] on its share (sent with its start
arguments, or fed through its queue: `torchspark.parallel.feeding`) and puts its result or its traceback on the
results queue (`torchspark.parallel.results`). Workers ignore SIGINT (the
parent decides) and exit on their own if the parent dies.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import signal
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from torchspark.parallel.feeding import QueueSource
from torchspark.parallel.results import to_numpy
from torchspark.training.comm import TorchDistCommunicator
from torchspark.training.progress import ProgressEndpoint
from torchspark.training.rendezvous.stores import private_store
from torchspark.training.task import WorkerTask
from torchspark.training.worker.body import WorkerEnv, train, worker_main
from torchspark.training.worker.devices import backend_for_devices
from torchspark.training.worker.loop import ItemSource

__all__ = ["PRELOAD", "worker_context", "backend_for_devices", "ChildArgs", "child_main"]

#: imported once by the fork server, so each worker starts without paying ``import torch`` again; torch._dynamo
#: (about 1 s, with sympy) is what torch.optim pulls in when the first optimizer is built
PRELOAD = ["torch", "torch._dynamo", "torchspark.parallel.bootstrap"]


def worker_context() -> Any:
    """The multiprocessing context for workers: ``forkserver`` with torch preloaded where the platform has it.

    A spawned worker imports torch afresh (1-2 s on a small machine, every fit); a worker forked from the fork
    server starts in milliseconds. The server itself is a clean single-threaded process that only imported
    modules (no torch op has run in it), so forking it is safe, also for CUDA. Falls back to ``spawn``.
    """
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _start_fork_server()
        return ctx
    return mp.get_context("spawn")


def _start_fork_server() -> None:
    """Start the fork server (if it is not running) with SIGINT ignored: Ctrl-C reaches the whole process group,
    and Python's fork server ignores it only once its preload (``import torch``, seconds) is done, so a Ctrl-C in
    that window printed its KeyboardInterrupt traceback next to the parent's own message. Python keeps an inherited
    SIG_IGN for SIGINT; the parent decides what a Ctrl-C does. Only the main thread may change signal handlers;
    elsewhere the server starts as multiprocessing starts it."""
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass(frozen=True)
class ChildArgs:
    """What worker ``rank`` receives at start (pickled to the new process)."""

    rank: int
    world_size: int
    store_port: int
    device: str
    backend: str
    task: WorkerTask
    #: the worker's whole share when known up front (batch-file paths or serialized batches); None = fed by queue
    items: list[str | bytes] | None
    progress_address: ProgressEndpoint | None
    timeout_s: float
    #: this run's secret: names the store's keys (the store listens on loopback and has no authentication)
    token: bytes
    shared_memory: bool = True


def _exit_with_parent() -> None:
    """Hard-exit this worker if the parent dies (SIGKILL leaves no chance to terminate us)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(3)

    threading.Thread(target=watch, name="torchspark-parent-watch", daemon=True).start()


def child_main(args: ChildArgs, data_queue: Any, results: Any) -> None:
    """Entry point of a worker process (module level so ``spawn`` can import it): puts ``("ok", rank, result)``
    or ``("error", rank, traceback)`` on ``results``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the parent decides
    _exit_with_parent()
    env = WorkerEnv(
        args.rank,
        args.device,
        rendezvous=partial(_join_store, args),
        progress=args.progress_address,
        collect_stats=args.task.collect_stats,
        report_scores=args.task.report_scores,
        on_error=lambda rank, trace: results.put(("error", rank, trace)),
    )
    source: Any = (
        ItemSource(args.items) if args.items is not None else QueueSource(data_queue, args.task.data_timeout_s)
    )
    train_rank = train(args.task, source)
    # tensors travel as numpy: torch's fd sharing would dangle once this process exits
    worker_main(env, lambda rank: results.put(("ok", args.rank, to_numpy(train_rank(rank)))))


def _join_store(args: ChildArgs, device: str) -> tuple[TorchDistCommunicator, None]:
    """The rendezvous of a local worker: join the store the parent hosts on loopback, build the communicator."""
    timeout = datetime.timedelta(seconds=args.timeout_s)
    store = dist.TCPStore("127.0.0.1", args.store_port, args.world_size, is_master=False, timeout=timeout)
    comm_device = device if args.backend == "nccl" else "cpu"  # gloo collectives run on host copies
    comm = TorchDistCommunicator(
        private_store(store, args.token),
        args.rank,
        args.world_size,
        args.backend,
        comm_device,
        args.timeout_s,
        args.shared_memory,
    )
    return comm, None
