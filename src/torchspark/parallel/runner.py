"""The local-process runner: ``run_worker`` in worker processes on this machine, talking over torch.distributed.

One run ([`LocalProcessRunner.run`][torchspark.parallel.LocalProcessRunner.run]):

1. host the ``TCPStore`` of the rendezvous on loopback, draw the run's token;
2. start one worker process per device (`torchspark.parallel.bootstrap`: from a fork server with torch
   preloaded, never by forking the caller), each with its share when it is known up front;
3. feed the workers whose data streams (`torchspark.parallel.feeding`);
4. collect the results, or raise the root cause of a failure (`torchspark.parallel.supervision`);
5. always: stop the feeders, shut every worker down (terminate after a failure or Ctrl-C) and join it, close the
   queues.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from torchspark.errors import ConfigError
from torchspark.parallel.bootstrap import ChildArgs, backend_for_devices, child_main, worker_context
from torchspark.parallel.devices import default_threads
from torchspark.parallel.feeding import WorkerShares, initial_items, put_item, start_feeders
from torchspark.parallel.supervision import Supervisor, sigterm_as_exit
from torchspark.training.config.mesh import MAX_TIMEOUT_S
from torchspark.training.driver.runner import NULL_CONTEXT, RunContext
from torchspark.training.progress import ProgressEndpoint
from torchspark.training.rendezvous.auth import new_token
from torchspark.training.rendezvous.stores import listening_store
from torchspark.training.task import WorkerResult, WorkerTask
from torchspark.training.waiting import join_within
from torchspark.validation import check_bool, check_float, check_int

__all__ = ["LocalProcessRunner", "DEFAULT_TIMEOUT_S"]

#: the rendezvous and collective timeout of a runner run on its own, without a master (the masters' default)
DEFAULT_TIMEOUT_S = 300.0

#: how long a stopped feeder thread gets to notice before the run ends without it (it is a daemon)
_FEEDER_JOIN_S = 10.0


def _check_agree(own_name: str, own: Any, master_name: str, master: Any, owner: str = "the training master") -> None:
    """A runner option set by the user (not None) must equal the option of ``owner`` (the training master, or
    ``ParallelWrapper``) that sets the same thing, when that one is set too."""
    if own is not None and master is not None and own != master:
        mine, theirs = (v if isinstance(v, bool) else f"{v:g}" for v in (own, master))
        on = "the master" if owner == "the training master" else owner
        raise ConfigError(
            f"LocalProcessRunner({own_name}={mine}) and {owner}'s {master_name}={theirs} disagree, "
            f"and both set the same thing; set {master_name} on {on} and leave the runner's {own_name}=None "
            f"(it then takes {owner}'s), or make them equal"
        )


class LocalProcessRunner:
    """Run one worker per device in fresh processes (`worker_context`) and
    supervise them.

    Args:
        devices: one device string per worker (``"cpu"``, ``"cuda:0"``...).
        threads_per_worker: torch intra-op threads in each worker (cores / workers is right for CPU training).
            None (default): ``ParallelWrapper``'s ``threads_per_worker`` when it runs the runner (its default: this
            machine's cores // the runner's devices), 1 on its own. A number set here must equal
            ``ParallelWrapper``'s ``threads_per_worker`` when that is set too (a ConfigError otherwise,
            [`use_master`][torchspark.parallel.LocalProcessRunner.use_master]).
        timeout_s: rendezvous and collective timeout, and the watchdog's limit for a silent worker. None (default):
            the training master's ``rendezvous_timeout_s`` when ``ParallelWrapper`` runs it (its default,
            `DEFAULT_TIMEOUT_S`, when the runner runs on its own). A number: the runner's own limit, which
            must equal the master's ``rendezvous_timeout_s`` in a ``ParallelWrapper`` fit (two limits for one wait
            are a ConfigError, [`use_master`][torchspark.parallel.LocalProcessRunner.use_master]). Example: ``LocalProcessRunner(["cpu"] * 2)`` with
            ``ParallelWrapper(net, master=ParameterAveragingTrainingMaster(rendezvous_timeout_s=30), runner=...)``
            waits 30 s for a hung worker.
        prefetch: queued minibatches per worker for a one-shot stream; None (default): the task's ``prefetch``
            (the master's ``worker_prefetch_num_batches``, ParallelWrapper's ``worker_prefetch_num_batches``), at least 1.
        progress_address: the parent's ``ProgressServer.endpoint`` (address and the fit's token), for progress
            and clock alignment, when the runner is used without a driver context (the driver's context opens
            one on 127.0.0.1 otherwise).
        exit_timeout_s: how long finished workers get to exit before they are terminated.
        shared_memory: let the workers sum through ``/dev/shm``. None (default): the training master's
            ``shared_memory_allreduce`` when ``ParallelWrapper`` runs it (True on its own); a bool set here must
            equal the master's in a ``ParallelWrapper`` fit (a ConfigError otherwise, [`use_master`][torchspark.parallel.LocalProcessRunner.use_master]).
    """

    def __init__(
        self,
        devices: Sequence[str],
        threads_per_worker: int | None = None,
        timeout_s: float | None = None,
        prefetch: int | None = None,
        progress_address: ProgressEndpoint | None = None,
        exit_timeout_s: float = 30.0,
        shared_memory: bool | None = None,
    ) -> None:
        self.devices = list(devices)
        self.threads_per_worker: int | None = check_int("threads_per_worker", threads_per_worker, 1, allow_none=True)
        self._wrapper_threads: int | None = None
        self.timeout_s: float | None = check_float(
            "timeout_s",
            timeout_s,
            above=0,
            maximum=MAX_TIMEOUT_S,
            finite=True,
            allow_none=True,
            unit="seconds",
            owner="LocalProcessRunner",
            none_means="the training master's rendezvous_timeout_s",
        )
        self._master_timeout_s: float | None = None
        self.prefetch = prefetch
        self.progress_address = progress_address
        self.exit_timeout_s = exit_timeout_s
        self.shared_memory = check_bool(
            "shared_memory",
            shared_memory,
            allow_none=True,
            owner="LocalProcessRunner",
            none_means="the training master's shared_memory_allreduce",
        )
        self._master_shared_memory: bool | None = None
        #: the worker processes of the last run (all joined when [`run`][torchspark.parallel.LocalProcessRunner.run] returns or raises)
        self.children: list[Any] = []

    def use_master(
        self, rendezvous_timeout_s: float, shared_memory_allreduce: bool, threads_per_worker: int | None = None
    ) -> None:
        """Take the training master's ``rendezvous_timeout_s`` and ``shared_memory_allreduce``, and
        ``ParallelWrapper``'s ``threads_per_worker`` (None: cores // devices, as ``ParallelWrapper``'s own runner),
        for the next runs (``ParallelWrapper`` calls it before each fit) where the runner's own ``timeout_s``,
        ``shared_memory`` or ``threads_per_worker`` is None.

        Raises:
            ConfigError: a value set on the runner differs from the master's or the wrapper's (naming both).
        """
        _check_agree("timeout_s", self.timeout_s, "rendezvous_timeout_s", rendezvous_timeout_s)
        _check_agree("shared_memory", self.shared_memory, "shared_memory_allreduce", shared_memory_allreduce)
        _check_agree(
            "threads_per_worker", self.threads_per_worker, "threads_per_worker", threads_per_worker, "ParallelWrapper"
        )
        self._master_timeout_s = rendezvous_timeout_s
        self._master_shared_memory = shared_memory_allreduce
        self._wrapper_threads = threads_per_worker or default_threads(len(self.devices))

    @property
    def effective_threads(self) -> int:
        """Torch threads per worker in the next run: ``threads_per_worker``, else ``ParallelWrapper``'s
        ([`use_master`][torchspark.parallel.LocalProcessRunner.use_master]), else 1."""
        if self.threads_per_worker is not None:
            return self.threads_per_worker
        return self._wrapper_threads if self._wrapper_threads is not None else 1

    @property
    def effective_timeout_s(self) -> float:
        """The limit the next run uses: ``timeout_s``, else the master's ([`use_master`][torchspark.parallel.LocalProcessRunner.use_master]), else
        `DEFAULT_TIMEOUT_S`."""
        if self.timeout_s is not None:
            return float(self.timeout_s)
        return self._master_timeout_s if self._master_timeout_s is not None else DEFAULT_TIMEOUT_S

    @property
    def effective_shared_memory(self) -> bool:
        """Whether the next run sums through ``/dev/shm``: ``shared_memory``, else the master's, else True."""
        if self.shared_memory is not None:
            return self.shared_memory
        return self._master_shared_memory if self._master_shared_memory is not None else True

    def run(self, task: WorkerTask, data: WorkerShares, context: RunContext = NULL_CONTEXT) -> list[WorkerResult]:
        """Run one worker per share of ``data`` on the first ``data.workers`` devices (all of them, unless an
        elastic fit runs fewer workers) and return their results by rank (the
        [`Runner`][torchspark.training.Runner] protocol; ``context`` gives the progress channel, the
        watchdog and the driver's ``fit`` phase)."""
        if data.workers > len(self.devices):
            raise ValueError(
                f"the data is split for {data.workers} workers but the runner has {len(self.devices)} devices"
            )
        if data.stream is not None and task.epochs != 1:
            raise ValueError(f"a one-shot stream feeds one epoch, but task.epochs={task.epochs}")
        progress_address = context.progress_address("127.0.0.1")
        if progress_address is None:  # no driver context: the caller's own progress server, if any
            progress_address = self.progress_address
        with context.recorder.phase("fit"), sigterm_as_exit():
            supervisor = Supervisor(self.effective_timeout_s, self.exit_timeout_s, context)
            return self._run(task, data, progress_address, supervisor)

    def _put(self, q: Any, item: Any, stop: threading.Event) -> bool:
        """How the feeders put one item into a worker's queue (`put_item`; a
        subclass may watch it)."""
        return put_item(q, item, stop)

    def _run(
        self, task: WorkerTask, data: WorkerShares, progress_address: ProgressEndpoint | None, supervisor: Supervisor
    ) -> list[WorkerResult]:
        """Steps 1-5 of the module docstring."""
        devices = self.devices[: data.workers]
        n = len(devices)
        ctx = worker_context()
        child_task = replace(
            task, num_threads=self.effective_threads, prefetch=task.prefetch if not data.queued else 0
        )  # the queue already prefetches
        backend = backend_for_devices(devices)
        timeout_s = supervisor.timeout_s
        store = listening_store("127.0.0.1", 0, n + 1, timeout_s)  # loopback only: the workers are local
        token = new_token()
        depth = max(1, task.prefetch if self.prefetch is None else self.prefetch)
        queues = [ctx.Queue(maxsize=depth) for _ in range(n)]
        results_q = ctx.Queue()
        stop = threading.Event()
        feeder_errors: list[BaseException] = []
        feeders: list[threading.Thread] = []
        finished = False
        self.children = supervisor.children
        try:
            for rank, device in enumerate(devices):
                args = ChildArgs(
                    rank,
                    n,
                    store.port,
                    device,
                    backend,
                    child_task,
                    initial_items(data, rank),
                    progress_address,
                    timeout_s,
                    token,
                    self.effective_shared_memory,
                )
                proc = ctx.Process(
                    target=child_main,
                    args=(args, queues[rank], results_q),
                    name=f"torchspark-worker-{rank}",
                    daemon=True,
                )
                proc.start()
                supervisor.children.append(proc)  # only started processes: shutdown joins every child
            feeders = start_feeders(data, queues, stop, feeder_errors, self._put)
            results = supervisor.collect(results_q, n, feeder_errors)
            finished = True
            return results
        finally:
            stop.set()
            supervisor.shutdown(graceful=finished)
            join_within(feeders, _FEEDER_JOIN_S)
            for q in (*queues, results_q):
                q.cancel_join_thread()
                q.close()
            del store
