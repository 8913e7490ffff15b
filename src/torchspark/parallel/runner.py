"""The local-process runner: ``run_worker`` in worker processes on this machine, talking over torch.distributed.

Workers start from a fork server with torch preloaded (:func:`worker_context`; ``spawn`` where there is none), never
by forking the caller.

The parent hosts the ``TCPStore`` for the rendezvous, hands each worker its data (a list of minibatches is
serialized once and sent with the worker's start arguments, then replayed every epoch, like Spark's direct route;
batch-file paths are read by the workers; a one-shot iterable streams through one bounded queue per worker),
collects results, and supervises:

1. a worker that raises sends its traceback; the parent waits briefly for the other workers' errors and raises
   :class:`WorkerError` with the root cause (not a peer's "Connection reset");
2. a worker that dies without a word (killed, out of memory, native crash) is noticed by polling and raises
   :class:`~torchspark.errors.WorkerLost` (name, pid, signal or exit code), as does a worker that stops responding:
   its peers time out after ``rendezvous_timeout_s`` and report only that symptom, or (with a driver context) its
   heartbeats stop; the driver's recovery then relaunches the workers;
3. on any failure, or Ctrl-C in the parent, every worker is terminated and joined in ``finally`` before the
   error propagates, so no process is left behind. Workers ignore SIGINT (the parent decides) and exit on their
   own if the parent dies.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchspark.data import DataSet, MultiDataSet, dataset_to_bytes
from torchspark.errors import DataError, WorkerLost
from torchspark.training.assignment import EpochItems
from torchspark.training.comm import TorchDistCommunicator
from torchspark.training.driver.failures import is_peer_failure, root_cause, traceback_tail, worker_error_type
from torchspark.training.driver.runner import RunContext
from torchspark.training.progress import ProgressEndpoint
from torchspark.training.rendezvous.auth import new_token
from torchspark.training.rendezvous.stores import listening_store, private_store
from torchspark.training.task import EpochSource, WorkerResult, WorkerTask
from torchspark.training.waiting import get_within, put_until_stopped
from torchspark.training.worker.loop import ItemSource, run_worker
from torchspark.training.worker.reporting import open_worker_hooks

__all__ = ["LocalProcessRunner", "WorkerShares", "QueueSource", "EPOCH_END", "backend_for_devices"]

log = logging.getLogger(__name__)

EPOCH_END = "__torchspark_epoch_end__"
_POLL_S = 0.2


def backend_for_devices(devices: Sequence[str]) -> str:
    """nccl when every worker has its own GPU; gloo otherwise (CPU, mixed, or a GPU shared by several workers,
    which nccl refuses)."""
    if all(d.startswith("cuda") for d in devices) and len(set(devices)) == len(devices):
        return "nccl"
    return "gloo"


#: imported once by the fork server, so each worker starts without paying ``import torch`` again; torch._dynamo
#: (about 1 s, with sympy) is what torch.optim pulls in when the first optimizer is built
PRELOAD = ["torch", "torch._dynamo", "torchspark.parallel.runner"]


def worker_context() -> Any:
    """The multiprocessing context for workers: ``forkserver`` with torch preloaded where the platform has it.

    A spawned worker imports torch afresh (1-2 s on a small machine, every fit); a worker forked from the fork
    server starts in milliseconds. The server itself is a clean single-threaded process that only imported
    modules (no torch op has run in it), so forking it is safe, also for CUDA. Falls back to ``spawn``.
    """
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return mp.get_context("spawn")


class QueueSource:
    """A worker's data fed by the parent through a queue; ``EPOCH_END`` closes each epoch."""

    #: every wait is bounded by ``data_timeout_s`` here, so the worker needs no loader thread to bound it
    bounded_wait = True

    def __init__(self, q: Any, timeout_s: float) -> None:
        self._q = q
        self._timeout_s = timeout_s

    def epoch(self, index: int) -> Iterable[Any]:
        while True:
            item = get_within(self._q, self._timeout_s,
                              lambda: f"no minibatch arrived from the parent within data_timeout_s={self._timeout_s}")
            if isinstance(item, str) and item == EPOCH_END:
                return
            yield item


@dataclass
class WorkerShares:
    """The workers' data as ``ParallelWrapper`` routes it: exactly one of ``feeds`` / ``epoch_feeds`` / ``paths`` /
    ``stream``.

    Args:
        workers: how many workers share it.
        feeds: per-worker lists of minibatches, sent once to each worker (serialized) and replayed every epoch.
        epoch_feeds: ``epoch_feeds[e][w]``: worker ``w``'s minibatches in epoch ``e`` of the fit (a new seeded
            plan every epoch), sent through each worker's queue epoch by epoch. ``first_epoch`` numbers them.
        paths: per-worker lists of batch-file paths, read by the workers themselves.
        stream: a one-shot iterable of minibatches dealt round-robin (one epoch only).
    """

    workers: int
    feeds: Sequence[Sequence[Any]] | None = None
    paths: Sequence[Sequence[str]] | None = None
    stream: Iterable[Any] | None = None
    epoch_feeds: Sequence[Sequence[Sequence[Any]]] | None = None
    first_epoch: int = 0

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.feeds, self.paths, self.stream, self.epoch_feeds)) != 1:
            raise ValueError("pass exactly one of feeds, epoch_feeds, paths or stream")

    def local_sources(self) -> list[EpochSource]:
        """Per-worker sources readable in this process (a stream is dealt round-robin here, as the feeder does)."""
        if self.stream is not None:
            dealt: list[list[Any]] = [[] for _ in range(self.workers)]
            for i, item in enumerate(self.stream):
                dealt[i % self.workers].append(item)
            return [ItemSource(items) for items in dealt]
        if self.epoch_feeds is not None:
            return [ItemSource([EpochItems(self.first_epoch + e, tuple(plan[w]))
                                for e, plan in enumerate(self.epoch_feeds)]) for w in range(self.workers)]
        shares = self.feeds if self.feeds is not None else self.paths
        assert shares is not None
        return [ItemSource(list(share)) for share in shares]


@dataclass(frozen=True)
class _ChildArgs:
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


def _child_main(args: _ChildArgs, data_queue: Any, results: Any) -> None:
    """Entry point of a worker process (module level so ``spawn`` can import it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the parent decides
    _exit_with_parent()
    comm: TorchDistCommunicator | None = None
    hooks = None
    try:
        if args.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(args.device))
        hooks = open_worker_hooks(args.rank, args.task.collect_stats, args.progress_address,
                                  report_scores=args.task.report_scores)
        store = private_store(dist.TCPStore("127.0.0.1", args.store_port, args.world_size, is_master=False,
                                            timeout=datetime.timedelta(seconds=args.timeout_s)), args.token)
        comm_device = args.device if args.backend == "nccl" else "cpu"  # gloo collectives run on host copies
        comm = TorchDistCommunicator(store, args.rank, args.world_size, args.backend, comm_device, args.timeout_s,
                                     args.shared_memory)
        source: Any = (ItemSource(args.items) if args.items is not None
                       else QueueSource(data_queue, args.task.data_timeout_s))
        result = run_worker(args.task, source, comm, args.device, hooks)
        # tensors travel as numpy: torch's fd sharing would dangle once this process exits
        results.put(("ok", args.rank, _to_numpy(result)))
    except BaseException:  # noqa: BLE001 - the parent re-raises it with this traceback
        results.put(("error", args.rank, traceback.format_exc()))
    finally:
        if comm is not None:
            comm.close()
        if hooks is not None and hooks.close is not None:
            hooks.close()


class LocalProcessRunner:
    """Run one worker per device in fresh processes (:func:`worker_context`) and supervise them.

    Args:
        devices: one device string per worker (``"cpu"``, ``"cuda:0"``...).
        threads_per_worker: torch intra-op threads in each worker (cores / workers is right for CPU training).
        timeout_s: rendezvous and collective timeout (``rendezvous_timeout_s``).
        prefetch: queued minibatches per worker for a one-shot stream; None (default): the task's ``prefetch``
            (the master's ``worker_prefetch_num_batches``, ParallelWrapper's ``prefetch_buffer``), at least 1.
        progress_address: the parent's ``ProgressServer.endpoint`` (address and the fit's token), for progress
            and clock alignment, when the runner is used without a driver context (the driver's context opens
            one on 127.0.0.1 otherwise).
        exit_timeout_s: how long finished workers get to exit before they are terminated.
        shared_memory: let the workers sum through ``/dev/shm`` (the master's ``shared_memory_allreduce``).
    """

    def __init__(self, devices: Sequence[str], threads_per_worker: int = 1, timeout_s: float = 300.0,
                 prefetch: int | None = None, progress_address: ProgressEndpoint | None = None,
                 exit_timeout_s: float = 30.0, shared_memory: bool = True) -> None:
        self.devices = list(devices)
        self.threads_per_worker = threads_per_worker
        self.timeout_s = timeout_s
        self.prefetch = prefetch
        self.progress_address = progress_address
        self.exit_timeout_s = exit_timeout_s
        self.shared_memory = shared_memory
        #: the worker processes of the last run (all joined when :meth:`run` returns or raises)
        self.children: list[Any] = []
        self._context: RunContext | None = None

    def run(self, task: WorkerTask, data: WorkerShares, context: RunContext | None = None) -> list[WorkerResult]:
        """Run one worker per device on its share of ``data`` and return their results by rank (the
        :class:`~torchspark.training.driver.runner.Runner` protocol; ``context`` gives the progress channel and the
        driver's ``fit`` phase)."""
        if data.workers != len(self.devices):
            raise ValueError(f"the data is split for {data.workers} workers but the runner has "
                             f"{len(self.devices)} devices")
        progress_address = context.progress_address("127.0.0.1") if context is not None else self.progress_address
        self._context = context
        with context.recorder.phase("fit") if context is not None else contextlib.nullcontext():
            return self._run(task, data.feeds, data.paths, data.stream, progress_address, data.epoch_feeds)

    def _run(self, task: WorkerTask, feeds: Sequence[Sequence[Any]] | None, paths: Sequence[Sequence[str]] | None,
             stream: Iterable[Any] | None, progress_address: ProgressEndpoint | None,
             epoch_feeds: Sequence[Sequence[Sequence[Any]]] | None = None) -> list[WorkerResult]:
        if stream is not None and task.epochs != 1:
            raise ValueError(f"a one-shot stream feeds one epoch, but task.epochs={task.epochs}")
        n = len(self.devices)
        ctx = worker_context()
        queued = stream is not None or epoch_feeds is not None
        child_task = replace(task, num_threads=self.threads_per_worker,
                             prefetch=task.prefetch if not queued else 0)  # the queue already prefetches
        backend = backend_for_devices(self.devices)
        store = listening_store("127.0.0.1", 0, n + 1, self.timeout_s)  # loopback only: the workers are local
        token = new_token()
        depth = max(1, task.prefetch if self.prefetch is None else self.prefetch)
        queues = [ctx.Queue(maxsize=depth) for _ in range(n)]
        results_q = ctx.Queue()
        stop = threading.Event()
        feeder_error: list[BaseException] = []
        feeders: list[threading.Thread] = []
        finished = False
        self.children = []
        try:
            for rank, device in enumerate(self.devices):
                args = _ChildArgs(rank, n, store.port, device, backend, child_task, _share(rank, feeds, paths),
                                  progress_address, self.timeout_s, token, self.shared_memory)
                proc = ctx.Process(target=_child_main, args=(args, queues[rank], results_q),
                                   name=f"torchspark-worker-{rank}", daemon=True)
                proc.start()
                self.children.append(proc)  # only started processes: _shutdown joins every child
            if stream is not None:
                feeders = [threading.Thread(target=self._feed, args=(queues, stream, stop, feeder_error),
                                            name="torchspark-feeder", daemon=True)]
            elif epoch_feeds is not None:  # one feeder per worker: a full queue must never starve a peer
                feeders = [threading.Thread(target=self._feed_epochs,
                                            args=(queues[w], [plan[w] for plan in epoch_feeds], stop, feeder_error),
                                            name=f"torchspark-feeder-{w}", daemon=True) for w in range(n)]
            for feeder in feeders:
                feeder.start()
            results = self._collect(results_q, n, feeder_error)
            finished = True
            return results
        finally:
            stop.set()
            self._shutdown(graceful=finished)
            for feeder in feeders:
                feeder.join(timeout=10)
            for q in (*queues, results_q):
                q.cancel_join_thread()
                q.close()
            del store

    # ------------------------------------------------------------------ parent side
    def _put(self, q: Any, item: Any, stop: threading.Event) -> bool:
        return put_until_stopped(q, item, stop, _POLL_S)

    def _feed(self, queues: list[Any], stream: Iterable[Any], stop: threading.Event,
              errors: list[BaseException]) -> None:
        """Deal a one-shot stream of minibatches round-robin, then close the (only) epoch on every queue."""
        n = len(queues)
        try:
            for i, item in enumerate(stream):
                if not self._put(queues[i % n], _wire(item), stop):
                    return
            for q in queues:
                if not self._put(q, EPOCH_END, stop):
                    return
        except BaseException as e:  # noqa: BLE001 - surfaced by _collect on the calling thread
            errors.append(e)

    def _feed_epochs(self, q: Any, epochs: Sequence[Sequence[Any]], stop: threading.Event,
                     errors: list[BaseException]) -> None:
        """Send one worker its minibatches epoch by epoch, closing each epoch."""
        try:
            for items in epochs:
                for item in items:
                    if not self._put(q, _wire(item), stop):
                        return
                if not self._put(q, EPOCH_END, stop):
                    return
        except BaseException as e:  # noqa: BLE001 - surfaced by _collect on the calling thread
            errors.append(e)

    def _collect(self, results_q: Any, n: int, feeder_error: list[BaseException]) -> list[WorkerResult]:
        results: dict[int, WorkerResult] = {}
        while len(results) < n:
            if feeder_error:
                raise feeder_error[0]
            try:
                kind, rank, payload = results_q.get(timeout=_POLL_S)
            except queue.Empty:
                if self._dead_children():
                    self._raise_worker_error(results_q, [])
                stalled = self._context.stalled(n, self.timeout_s) if self._context is not None else None
                if stalled is not None:
                    raise stalled
                continue
            if kind == "error":
                self._raise_worker_error(results_q, [(rank, payload)])
            results[rank] = _to_torch(payload)
        return [results[r] for r in range(n)]

    def _dead_children(self) -> list[Any]:
        """Workers that ended abnormally (a worker that raised still exits with 0 after reporting)."""
        return [p for p in self.children if not p.is_alive() and p.exitcode not in (0, None)]

    def _raise_worker_error(self, results_q: Any, errors: list[tuple[int, str]], wait_s: float = 3.0) -> None:
        """Gather the other workers' errors for a moment, then raise the root cause: a worker's own error, else
        a worker's death (its peers' "connection closed" is only the symptom of either)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not any(not is_peer_failure(tb) for _, tb in errors):
            try:
                kind, rank, payload = results_q.get(timeout=_POLL_S)
            except queue.Empty:
                if self._dead_children():
                    break  # a worker died without a word: the queue is drained, nothing more will explain it
                continue
            if kind == "error":
                errors.append((rank, payload))
        found = root_cause(errors)
        dead = self._dead_children()
        if dead and (found is None or is_peer_failure(found[1])):
            symptom = f"; then worker {found[0]} failed: {_last_line(found[1])}" if found else ""
            status = _exit_status(dead[0].exitcode)
            raise WorkerLost(f"worker process {dead[0].name} (pid {dead[0].pid}) died with {status}: killed, "
                             "out of memory, crashed in native code, or failed to start (a script that calls fit "
                             "at top level needs `if __name__ == '__main__':`, since workers start in fresh "
                             f"processes that import it){symptom}", rank=_rank_of(dead[0]),
                             executor=f"{dead[0].name} (pid {dead[0].pid})", exit_status=status,
                             reason=f"worker process died with {status}")
        if found is None:
            return
        rank, tb = found
        if is_peer_failure(tb):  # every report is a peer's symptom: whoever did not report stopped responding
            silent = [r for r in range(len(self.children)) if r not in {e[0] for e in errors}]
            who = silent[0] if silent else None
            proc = self.children[who] if who is not None else None
            raise WorkerLost(
                f"worker {who if who is not None else '?'} stopped responding: its peers gave up waiting for it "
                f"(rendezvous_timeout_s={self.timeout_s:g}); worker {rank} reported: {_last_line(tb)}", rank=who,
                executor=f"{proc.name} (pid {proc.pid})" if proc is not None else None, exit_status="no response",
                reason=f"peers timed out: {_last_line(tb)}")
        raise worker_error_type(tb)(f"worker {rank} failed: {_last_line(tb)}\n--- worker traceback ---\n"
                                    f"{traceback_tail(tb)}")

    def _shutdown(self, graceful: bool) -> None:
        """Join every worker; after a failure or Ctrl-C terminate them at once (then kill the stubborn)."""
        if graceful:
            deadline = time.monotonic() + self.exit_timeout_s
            for p in self.children:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.children:
            if p.is_alive():
                p.terminate()
                with contextlib.suppress(OSError):  # a stopped (SIGSTOP) worker acts on SIGTERM only once resumed
                    os.kill(p.pid, signal.SIGCONT)
        for p in self.children:
            p.join(timeout=10.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
            if p.is_alive():
                log.error("worker process %s (pid %s) survived SIGKILL", p.name, p.pid)


def _share(rank: int, feeds: Sequence[Sequence[Any]] | None,
           paths: Sequence[Sequence[str]] | None) -> list[str | bytes] | None:
    """What worker ``rank`` receives at start: its paths, or its minibatches serialized once (None: a stream)."""
    if paths is not None:
        return list(paths[rank])
    if feeds is not None:
        return [_wire(b) for b in feeds[rank]]
    return None


def _wire(item: Any) -> Any:
    """Minibatches cross the process boundary as batch bytes (no shared-memory file descriptors to leak)."""
    if isinstance(item, (DataSet, MultiDataSet)):
        return dataset_to_bytes(item)
    if isinstance(item, (bytes, str)):
        return item
    raise DataError(f"cannot send a {type(item).__name__} to a worker; expected a DataSet or MultiDataSet")


def _map_tensors(result: WorkerResult, fn: Any) -> WorkerResult:
    return replace(
        result,
        params=None if result.params is None else fn(result.params),
        updater_state=None if result.updater_state is None else fn(result.updater_state),
        extra_state={k: fn(v) for k, v in result.extra_state.items()},
        buffers=None if result.buffers is None else {k: fn(v) for k, v in result.buffers.items()},
    )


def _to_numpy(result: WorkerResult) -> WorkerResult:
    return _map_tensors(result, lambda t: t.detach().cpu().numpy())


def _to_torch(result: WorkerResult) -> WorkerResult:
    return _map_tensors(result, torch.from_numpy)


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _rank_of(proc: Any) -> int | None:
    """The rank in a worker process's name (``torchspark-worker-3`` -> 3)."""
    tail = str(proc.name).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _last_line(tb: str) -> str:
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown error"
