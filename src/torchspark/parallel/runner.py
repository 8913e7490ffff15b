"""The local-process runner: ``run_worker`` in spawned processes on this machine, talking over torch.distributed.

The parent hosts the ``TCPStore`` for the rendezvous, feeds driver-side data through one bounded queue per worker
(prefetch), collects results, and supervises: if any worker fails or the user presses Ctrl-C, every worker is
terminated and joined before the error is re-raised, so no process is left behind.
"""

from __future__ import annotations

import datetime
import logging
import torch.multiprocessing as mp
import queue
import threading
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist

from torchspark.errors import WaitTimeout, WorkerError
from torchspark.training.comm import TorchDistCommunicator
from torchspark.training.devices import backend_for_device
from torchspark.training.reporting import open_worker_hooks
from torchspark.training.runner import is_peer_failure, root_cause, traceback_tail
from torchspark.training.worker import ItemSource, WorkerResult, WorkerTask, run_worker

__all__ = ["LocalProcessRunner", "QueueSource", "EPOCH_END"]

log = logging.getLogger(__name__)

EPOCH_END = "__torchspark_epoch_end__"
_POLL_S = 0.2


class QueueSource:
    """A worker's data fed by the parent through a queue; ``EPOCH_END`` closes each epoch."""

    def __init__(self, q: Any, timeout_s: float) -> None:
        self._q = q
        self._timeout_s = timeout_s

    def epoch(self, index: int) -> Iterable[Any]:
        while True:
            try:
                item = self._q.get(timeout=self._timeout_s)
            except queue.Empty:
                raise WaitTimeout(
                    f"no minibatch arrived from the parent within data_timeout_s={self._timeout_s}"
                ) from None
            if isinstance(item, str) and item == EPOCH_END:
                return
            yield item


@dataclass(frozen=True)
class _ChildArgs:
    rank: int
    world_size: int
    store_port: int
    device: str
    task: WorkerTask
    paths: list[str] | None
    progress_address: tuple[str, int] | None
    timeout_s: float


def _child_main(args: _ChildArgs, data_queue: Any, results: Any) -> None:
    """Entry point of a worker process (module level so ``spawn`` can import it)."""
    comm: TorchDistCommunicator | None = None
    hooks = None
    try:
        if args.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(args.device))
        hooks = open_worker_hooks(args.rank, args.task.collect_stats, args.progress_address)
        store = dist.TCPStore("127.0.0.1", args.store_port, args.world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=args.timeout_s))
        comm = TorchDistCommunicator(store, args.rank, args.world_size, backend_for_device(args.device), args.device,
                                     args.timeout_s)
        source: Any = ItemSource(args.paths) if args.paths is not None else QueueSource(data_queue,
                                                                                        args.task.data_timeout_s)
        result = run_worker(args.task, source, comm, args.device, hooks)
        # tensors travel as numpy: torch's fd sharing would dangle once this process exits
        results.put(("ok", args.rank, _to_numpy(result)))
    except BaseException:  # noqa: BLE001 - the parent re-raises it with this traceback
        tb = traceback.format_exc()
        results.put(("error", args.rank, tb))
    finally:
        if comm is not None:
            comm.close()
        if hooks is not None and hooks.close is not None:
            hooks.close()


class LocalProcessRunner:
    """Run one worker per device in spawned processes.

    Args:
        devices: one device string per worker (``"cpu"``, ``"cuda:0"``...).
        threads_per_worker: torch intra-op threads in each worker (cores / workers is right for CPU training).
        timeout_s: rendezvous and collective timeout (``rendezvous_timeout_s``).
        prefetch: queued minibatches per worker for driver-fed data.
        progress_address: the parent's ProgressServer, for progress, errors and clock alignment.
    """

    def __init__(self, devices: Sequence[str], threads_per_worker: int = 1, timeout_s: float = 300.0,
                 prefetch: int = 2, progress_address: tuple[str, int] | None = None) -> None:
        self.devices = list(devices)
        self.threads_per_worker = threads_per_worker
        self.timeout_s = timeout_s
        self.prefetch = max(1, prefetch)
        self.progress_address = progress_address
        self.children: list[Any] = []

    def run(self, task: WorkerTask, feeds: Sequence[Sequence[Any]] | None = None,
            paths: Sequence[Sequence[str]] | None = None, stream: Iterable[Any] | None = None) -> list[WorkerResult]:
        """Run the workers on their data: ``paths`` (read by the workers), ``feeds`` (per-worker lists fed through
        the queues, every epoch) or ``stream`` (one-shot iterable dealt round-robin, one epoch)."""
        n = len(self.devices)
        ctx = mp.get_context("spawn")
        store = dist.TCPStore("127.0.0.1", 0, n + 1, is_master=True,
                              timeout=datetime.timedelta(seconds=self.timeout_s), wait_for_workers=False)
        child_task = replace(task, num_threads=self.threads_per_worker,
                             prefetch=task.prefetch if paths is not None else 0)
        queues = [ctx.Queue(maxsize=self.prefetch) for _ in range(n)]
        results_q = ctx.Queue()
        self.children = []
        for rank, device in enumerate(self.devices):
            args = _ChildArgs(rank, n, store.port, device, child_task, list(paths[rank]) if paths else None,
                              self.progress_address, self.timeout_s)
            proc = ctx.Process(target=_child_main, args=(args, queues[rank], results_q),
                               name=f"torchspark-worker-{rank}", daemon=True)
            proc.start()
            self.children.append(proc)
        stop = threading.Event()
        feeder_error: list[BaseException] = []
        feeder = None
        if paths is None:
            feeder = threading.Thread(target=self._feed, args=(queues, task.epochs, feeds, stream, stop, feeder_error),
                                      name="torchspark-feeder", daemon=True)
            feeder.start()
        try:
            return self._collect(results_q, n, feeder_error)
        finally:
            stop.set()
            self._shutdown()
            if feeder is not None:
                feeder.join(timeout=10)
            for q in (*queues, results_q):
                q.cancel_join_thread()
                q.close()
            del store

    # ------------------------------------------------------------------ parent side
    def _put(self, q: Any, item: Any, stop: threading.Event) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _feed(self, queues: list[Any], epochs: int, feeds: Sequence[Sequence[Any]] | None,
              stream: Iterable[Any] | None, stop: threading.Event, errors: list[BaseException]) -> None:
        n = len(queues)
        try:
            for _ in range(epochs if feeds is not None else 1):
                if feeds is not None:
                    longest = max((len(f) for f in feeds), default=0)
                    for k in range(longest):  # interleave so every worker's queue fills in step
                        for w in range(n):
                            if k < len(feeds[w]) and not self._put(queues[w], feeds[w][k], stop):
                                return
                else:
                    for i, item in enumerate(stream or ()):
                        if not self._put(queues[i % n], item, stop):
                            return
                for q in queues:
                    if not self._put(q, EPOCH_END, stop):
                        return
        except BaseException as e:  # noqa: BLE001 - surfaced by _collect
            errors.append(e)

    def _collect(self, results_q: Any, n: int, feeder_error: list[BaseException]) -> list[WorkerResult]:
        results: dict[int, WorkerResult] = {}
        while len(results) < n:
            if feeder_error:
                raise feeder_error[0]
            try:
                kind, rank, payload = results_q.get(timeout=_POLL_S)
            except queue.Empty:
                dead = [p for p in self.children if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    self._raise_worker_error(results_q, [])
                    raise WorkerError(f"worker process {dead[0].name} died with exit code {dead[0].exitcode} "
                                      "(killed, out of memory, or crashed in native code)")
                continue
            if kind == "error":
                self._raise_worker_error(results_q, [(rank, payload)])
            results[rank] = _to_torch(payload)
        return [results[r] for r in range(n)]

    def _raise_worker_error(self, results_q: Any, errors: list[tuple[int, str]], wait_s: float = 2.0) -> None:
        """Gather the other workers' errors for a moment, then raise the root cause (not a peer's symptom)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not any(not is_peer_failure(tb) for _, tb in errors):
            try:
                kind, rank, payload = results_q.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if kind == "error":
                errors.append((rank, payload))
        found = root_cause(errors)
        if found is None:
            return
        rank, tb = found
        raise WorkerError(f"worker {rank} failed: {_last_line(tb)}\n--- worker traceback ---\n{traceback_tail(tb)}")

    def _shutdown(self) -> None:
        for p in self.children:
            if p.is_alive():
                p.join(timeout=2.0)
        for p in self.children:
            if p.is_alive():
                p.terminate()
        for p in self.children:
            p.join(timeout=10.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)


def _map_tensors(result: WorkerResult, fn: Any) -> WorkerResult:
    return replace(
        result,
        params=None if result.params is None else fn(result.params),
        updater_state=None if result.updater_state is None else fn(result.updater_state),
        extra_state={k: fn(v) for k, v in result.extra_state.items()},
    )


def _to_numpy(result: WorkerResult) -> WorkerResult:
    return _map_tensors(result, lambda t: t.detach().cpu().numpy())


def _to_torch(result: WorkerResult) -> WorkerResult:
    return _map_tensors(result, torch.from_numpy)


def _last_line(tb: str) -> str:
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown error"
